"""Checkpoints: untrusted pickles never run, broken files fail clearly,
and a crash while writing never leaves a truncated checkpoint behind."""
import os
import pickle

import pytest
import torch
from conftest import run_tool
from mmengine.fileio import get_file_backend
from mmengine.registry import MODELS

import clustr_mm  # noqa: F401
from clustr_mm.utils.checkpoint import read_checkpoint


class CreatesFileOnLoad:
    """Unpickling this calls os.system: what a malicious checkpoint does."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


@pytest.fixture
def crafted(tmp_path):
    marker = tmp_path / 'pwned'
    path = tmp_path / 'crafted.pth'
    state = ClusTRTiny().state_dict()
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in state.items()},
                'payload': CreatesFileOnLoad(marker)}, path)
    return path, marker


def ClusTRTiny(**kwargs):
    return MODELS.build(dict(type='ClusTR', arch=dict(
        embed_dims=(8, 16, 32, 64), depths=(1, 1, 1, 1),
        num_heads=(1, 1, 2, 4), mlp_ratios=(2, 2, 2, 2)), **kwargs))


def test_read_checkpoint_refuses_code(crafted):
    path, marker = crafted
    with pytest.raises(pickle.UnpicklingError, match='refusing to load .*system'):
        read_checkpoint(str(path))
    assert not marker.exists()


def test_pretrained_init_refuses_code(crafted):
    path, marker = crafted
    model = ClusTRTiny(init_cfg=dict(type='Pretrained', checkpoint=str(path),
                                     prefix='backbone.'))
    with pytest.raises(pickle.UnpicklingError, match='refusing to load'):
        model.init_weights()
    assert not marker.exists()


def test_converter_and_test_tool_refuse_code(crafted, tiny_data, tmp_path):
    path, marker = crafted
    conv = run_tool(['tools/model_converters/clustr_official_to_mm.py',
                     str(path), str(tmp_path / 'out.pth')], check=False)
    assert conv.returncode != 0 and 'refusing to load' in conv.stdout
    test = run_tool(['tools/test.py', 'configs/clustr/clustr-t_embedded-imagenet.py',
                     str(path), '--work-dir', str(tmp_path / 'wd')], check=False)
    assert test.returncode != 0 and 'Weights only load failed' in test.stdout
    assert not marker.exists()
    assert not (tmp_path / 'out.pth').exists()


def test_truncated_checkpoint_error_names_file(tmp_path):
    path = tmp_path / 'weights.pth'
    torch.save(ClusTRTiny().state_dict(), path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(ValueError, match='cannot read checkpoint .*weights.pth'):
        read_checkpoint(str(path))
    path.write_bytes(b'not a checkpoint at all')
    with pytest.raises(ValueError, match='truncated, corrupt'):
        read_checkpoint(str(path))


def test_interrupted_checkpoint_write_keeps_old_file(tmp_path, monkeypatch):
    backend = get_file_backend(str(tmp_path / 'x'))
    target = tmp_path / 'epoch_1.pth'
    backend.put(b'complete checkpoint', target)

    def crash(fd):
        raise KeyboardInterrupt('killed while writing')

    monkeypatch.setattr(os, 'fsync', crash)
    with pytest.raises(KeyboardInterrupt):
        backend.put(b'half-writ', target)
    assert target.read_bytes() == b'complete checkpoint'
    assert sorted(p.name for p in tmp_path.iterdir()) == ['epoch_1.pth']

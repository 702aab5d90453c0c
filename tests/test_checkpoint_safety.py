"""Checkpoints: untrusted pickles never run, broken files fail clearly,
and a crash while writing never leaves a truncated checkpoint behind."""
import argparse
import collections
import io
import os
import pickle

import numpy as np
import pytest
import torch
from conftest import run_tool
from mmengine.fileio import get_file_backend
from mmengine.registry import MODELS

import clustr_mm  # noqa: F401
from clustr_mm.checkpoints import safe_pickle
from clustr_mm.checkpoints.loading import read_checkpoint

pytestmark = pytest.mark.torch21


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


@pytest.mark.slow
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
    with pytest.raises(ValueError, match='cannot read checkpoint .*weights.pth'
                       ': it is a torch zip file that is truncated or corrupt'):
        read_checkpoint(str(path))
    path.write_bytes(b'not a checkpoint at all')
    with pytest.raises(ValueError, match="a text file, not a torch checkpoint "
                       r"\(starts with 'not a checkpoint"):
        read_checkpoint(str(path))
    path.write_bytes(b'')
    with pytest.raises(ValueError, match='an empty file'):
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


# --- The allow-list on every torch: 'native' (torch's weights-only unpickler
# with add_safe_globals) and 'restricted' (our find_class allow-list, used where
# torch cannot take the list). Both paths run on every stack: the restricted
# one is forced where torch could do it natively.

def _runner_like_checkpoint(path):
    """What MMEngine's Runner.save_checkpoint writes, message hub included."""
    from mmengine.logging import MessageHub
    hub = MessageHub.get_instance('clustr_mm_test_ckpt')
    for loss in (3.0, 2.0, 1.0):
        hub.update_scalar('train/loss', loss)
    hub.update_info('iter', 7)
    state = ClusTRTiny().state_dict()
    torch.save({'meta': {'epoch': 2, 'iter': 7, 'seed': 1,
                         'dataset_meta': {'classes': ('a', 'b')}},
                'state_dict': state,
                'message_hub': hub.state_dict(),
                'optimizer': {'state': {}, 'param_groups': [{'lr': 0.1}]},
                'np_array': np.arange(4, dtype=np.float32),
                'np_scalar': np.float64(0.5),
                'args': argparse.Namespace(lr=0.1, sizes=[224, 224]),
                'counts': collections.Counter(car=2)}, path)
    return state


def _loaders():
    loaders = [pytest.param(safe_pickle.restricted_load, id='restricted')]
    if safe_pickle.allow_runner_checkpoint_types() == 'native':
        loaders.append(pytest.param(
            lambda f, map_location=None: torch.load(
                f, map_location=map_location, weights_only=True),
            id='native'))
    else:
        loaders.append(pytest.param(
            None, id='native', marks=pytest.mark.skip(
                reason=f'torch {torch.__version__} cannot take the allow-list '
                'natively (no add_safe_globals or no (obj, name) form)')))
    return loaders


def test_mode_follows_what_torch_offers():
    mode = safe_pickle.allow_runner_checkpoint_types()
    ser = torch.serialization
    if os.environ.get('CLUSTR_MM_SAFE_LOAD') == 'restricted':
        assert mode == 'restricted'
    elif not hasattr(ser, 'add_safe_globals'):  # torch 2.0 - 2.3
        assert mode == 'restricted'
    else:
        assert mode in ('native', 'restricted')
    if mode == 'native':  # registered under both numpy 1.x and 2.x names
        names = {entry[1] for entry in ser.get_safe_globals()
                 if isinstance(entry, tuple)}
        assert {'builtins.getattr', 'numpy.core.multiarray._reconstruct',
                'numpy._core.multiarray._reconstruct'} <= names


@pytest.mark.parametrize('load', _loaders())
def test_runner_checkpoint_loads(load, tmp_path):
    from mmengine.logging import HistoryBuffer
    path = tmp_path / 'epoch_2.pth'
    state = _runner_like_checkpoint(path)
    ckpt = load(str(path), map_location='cpu')
    assert ckpt['meta']['epoch'] == 2
    for key, value in state.items():
        assert torch.equal(ckpt['state_dict'][key], value), key
    loss = ckpt['message_hub']['log_scalars']['train/loss']
    assert isinstance(loss, HistoryBuffer)
    assert loss.current() == 1.0 and loss.mean() == pytest.approx(2.0)
    assert ckpt['np_array'].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert ckpt['np_scalar'] == 0.5
    assert ckpt['args'] == argparse.Namespace(lr=0.1, sizes=[224, 224])
    assert ckpt['counts'] == collections.Counter(car=2)


@pytest.mark.parametrize('load', _loaders())
def test_code_running_pickles_refused(load, crafted, tmp_path):
    path, marker = crafted
    with pytest.raises((pickle.UnpicklingError, RuntimeError),
                       match=r'Weights only load failed[\s\S]*GLOBAL (posix|os)\.system'):
        load(str(path))
    assert not marker.exists()
    # getattr is allowed only for HistoryBuffer's statistics methods, so a
    # pickle cannot walk from an allowed class to anything else.
    from mmengine.logging import HistoryBuffer

    class WalksAttributes:
        def __reduce__(self):
            return (getattr, (HistoryBuffer, '__init__'))

    walk = tmp_path / 'walk.pth'
    torch.save({'x': WalksAttributes()}, walk)
    with pytest.raises((pickle.UnpicklingError, RuntimeError),
                       match='getattr|GLOBAL builtins.getattr'):
        load(str(walk))


def test_restricted_unpickler_reads_numpy_1_and_2_pickles():
    arr = np.arange(6, dtype=np.int16).reshape(2, 3)
    data = pickle.dumps(arr, protocol=2)
    names = (b'numpy.core.multiarray', b'numpy._core.multiarray')
    here = next(n for n in names if n in data)
    for name in names:  # the name this numpy writes, and the other one
        other = data.replace(here, name)
        got = safe_pickle.RestrictedUnpickler(io.BytesIO(other)).load()
        assert got.dtype == np.int16 and got.tolist() == arr.tolist()
    with pytest.raises(pickle.UnpicklingError, match='GLOBAL os.system'):
        safe_pickle.RestrictedUnpickler(io.BytesIO(
            b'cos\nsystem\n(Vtrue\ntR.')).load()


def test_mmengine_loads_are_restricted(crafted, tmp_path):
    """--resume, load_from and tools/test.py go through MMEngine's loader."""
    from mmengine.runner.checkpoint import _load_checkpoint
    path, marker = crafted
    with pytest.raises((pickle.UnpicklingError, RuntimeError),
                       match='Weights only load failed'):
        _load_checkpoint(str(path), map_location='cpu')
    assert not marker.exists()
    good = tmp_path / 'epoch_2.pth'
    _runner_like_checkpoint(good)
    assert _load_checkpoint(str(good), map_location='cpu')['meta']['epoch'] == 2


def test_detection_falls_back_where_torch_lacks_the_tuple_form(monkeypatch):
    """torch 2.4/2.5: add_safe_globals exists but cannot register our getattr
    as builtins.getattr. The probe must notice, leave torch's list as it was
    and choose the restricted mode; torch 2.0-2.3 have no add_safe_globals."""
    ser = torch.serialization
    if not hasattr(ser, 'add_safe_globals'):
        assert not safe_pickle._native_supported()
        return
    registered = list(ser.get_safe_globals())  # ours, from the import
    ser.clear_safe_globals()
    try:
        ser.add_safe_globals([collections.Counter])  # someone else's entry
        before = list(ser.get_safe_globals())
        original = ser.add_safe_globals

        def without_tuples(entries):
            original([e for e in entries if not isinstance(e, tuple)])

        monkeypatch.setattr(ser, 'add_safe_globals', without_tuples)
        assert not safe_pickle._native_supported()
        assert list(ser.get_safe_globals()) == before
        monkeypatch.undo()
        assert safe_pickle._native_supported()  # the real one can
        assert collections.Counter in ser.get_safe_globals()
        ser.clear_safe_globals()
        ser.add_safe_globals(before)
        monkeypatch.delattr(ser, 'add_safe_globals')
        assert not safe_pickle._native_supported()
        assert list(ser.get_safe_globals()) == before
    finally:
        monkeypatch.undo()
        ser.clear_safe_globals()
        ser.add_safe_globals(registered)


@pytest.mark.slow
@pytest.mark.skipif(
    safe_pickle.allow_runner_checkpoint_types() == 'native',
    reason='torch allow-lists the runner types here; the forced restricted '
    'resume runs in test_tools.py::'
    'test_killed_run_resumes_to_the_uninterrupted_result')
def test_resume_under_forced_restricted_mode(tiny_data, tmp_path):
    """The fallback path end to end where it is torch's only one (torch <
    2.6, e.g. the torch 2.1 stack): train, then resume (the runner
    checkpoint through the restricted unpickler)."""
    config = 'configs/clustr/clustr-t_embedded-imagenet.py'
    env = {'CLUSTR_MM_SAFE_LOAD': 'restricted'}
    base = ['--work-dir', str(tmp_path), '--cfg-options',
            'train_cfg.val_interval=100', 'default_hooks.checkpoint.interval=1']
    run_tool(['tools/train.py', config, *base, 'train_cfg.max_epochs=1'],
             env=env)
    out = run_tool(['tools/train.py', config, '--resume', *base,
                    'train_cfg.max_epochs=2'], env=env).stdout
    assert 'resumed epoch: 1' in out, out[-3000:]
    assert (tmp_path / 'epoch_2.pth').exists()


def test_one_unwrapping_for_every_reader(tmp_path):
    """A file wrapping weights under both 'state_dict' and 'model' (and
    DataParallel's 'module.') reads the same through the checkpoint reader
    and a backbone's Pretrained init: 'state_dict' wins in both."""
    model = MODELS.build(dict(type='ClusTR', arch=dict(
        embed_dims=(8, 8, 8, 8), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1),
        mlp_ratios=(1, 1, 1, 1))))
    good = {f'module.{k}': torch.full_like(v, 0.5)
            for k, v in model.state_dict().items()}
    path = tmp_path / 'both.pth'
    torch.save(dict(model={'module.x': torch.zeros(1)}, state_dict=good),
               path)
    assert read_checkpoint(str(path)).keys() == model.state_dict().keys()
    model = MODELS.build(dict(type='ClusTR', arch=dict(
        embed_dims=(8, 8, 8, 8), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 1),
        mlp_ratios=(1, 1, 1, 1)), init_cfg=dict(type='Pretrained',
                                                checkpoint=str(path))))
    model.init_weights()
    assert all((v == 0.5).all() for v in model.state_dict().values())

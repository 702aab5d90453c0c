"""The pinned stack is what the environment script promised."""
import importlib
import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _pins():
    pins = {}
    for name in ('torch.txt', 'mmlibs.txt'):
        for line in (ROOT / 'requirements' / name).read_text().splitlines():
            m = re.match(r'^([A-Za-z0-9_.-]+)==([^\s#]+)', line)
            if m:
                pins[m.group(1).lower().replace('_', '-')] = m.group(2)
    pins.update({'mmcv': '2.1.0', 'mmpose': '1.3.2'})
    return pins


@pytest.mark.parametrize('dist,version', sorted(_pins().items()))
def test_installed_versions_match_pins(dist, version):
    from importlib.metadata import version as installed
    assert installed(dist).split('+')[0] == version


@pytest.mark.parametrize(
    'module', ['mmengine', 'mmcv', 'mmdet', 'mmseg', 'mmpretrain', 'mmpose'])
def test_libraries_import(module):
    assert importlib.import_module(module).__version__


def test_mmcv_ops_run_on_cpu():
    from mmcv.ops import RoIAlign, nms
    boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 11., 11.],
                          [20., 20., 30., 30.]])
    dets, keep = nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5)
    assert keep.tolist() == [0, 2]
    assert torch.allclose(dets[:, 4], torch.tensor([0.9, 0.7]))
    # A 2x2 RoIAlign of a linear ramp samples the ramp at the bin centres.
    feat = torch.arange(16.).reshape(1, 1, 4, 4)
    out = RoIAlign((1, 1), 1.0, sampling_ratio=1, aligned=False)(
        feat, torch.tensor([[0., 0., 0., 2., 2.]]))
    assert out.item() == pytest.approx(feat[0, 0, 1, 1].item())


def test_package_registers_in_root_registry():
    import clustr_mm
    from mmengine.registry import MODELS
    assert re.match(r'\d+\.\d+\.\d+', clustr_mm.__version__)
    for name in ('ClusTR', 'PaCaViT'):
        assert name in MODELS.module_dict, name


def test_reimport_does_not_fail_registration():
    import clustr_mm.models.backbones.clustr as mod
    importlib.reload(mod)
    from mmengine.registry import MODELS
    assert MODELS.get('ClusTR') is mod.ClusTR

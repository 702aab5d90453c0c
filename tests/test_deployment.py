"""ONNX export with tools/deployment/pytorch2onnx.py: the graphs ONNX Runtime
runs equal PyTorch's outputs, dynamic graphs at other batches and sizes, and
a graph that would be wrong is refused (no file), never written.

Exports are the costly part (seconds each on a 2-core CPU): each test makes
one graph and checks it at several inputs; sizes are small.
"""
import onnx
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS
from torch import nn

from conftest import ROOT, load_tool, run_tool

tool = load_tool('pytorch2onnx', 'deployment')
TOL = 1e-4  # largest |ONNX Runtime - PyTorch| accepted in these tests


def export(tmp_path, model, shape, checks=None, batch=1, dynamic=True,
           name='model.onnx', **kwargs):
    """Export ``model`` (a config dict) and return (report, file)."""
    out = tmp_path / name
    cfg = Config(dict(model=model))
    report = tool.export_and_check(
        cfg, None, shape, str(out), batch=batch, dynamic=dynamic,
        check_shapes=checks, log=lambda *a: None, **kwargs)
    return report, out


def input_dims(path):
    """The ONNX input's dims: an int where fixed, its name where dynamic."""
    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    return [d.dim_param or d.dim_value for d in dims]


def assert_all_close(report, inputs):
    """Every output at every one of ``inputs`` within TOL."""
    assert sorted({tuple(r['input']) for r in report['checks']}) == sorted(
        (b, 3, h, w) for b, h, w in inputs)
    worst = max(r['max_abs_diff'] for r in report['checks'])
    assert worst <= TOL, report['checks']


# PaCa-ViT: one graph for every batch and size.
@pytest.mark.parametrize('clustering', ['conv', 'mlp', 'teacher'])
def test_paca_t_one_dynamic_graph_any_batch_and_size(tmp_path, clustering):
    checks = [(3, 57, 83), (1, 97, 65)]  # odd sizes, batch 3 and 1
    report, out = export(
        tmp_path, dict(type='PaCaViT', arch='tiny', clustering=clustering),
        (64, 96), checks)
    assert_all_close(report, [(1, 64, 96)] + checks)
    assert report['dynamic_hw'] and out.is_file()
    assert input_dims(out) == ['batch', 3, 'height', 'width']
    # the stride-4 map follows each input (ceil(57 / 4) x ceil(83 / 4))
    shapes = {tuple(r['input']): r['shape'] for r in report['checks']
              if r['output'] == 'feat0'}
    assert shapes[(3, 3, 57, 83)] == [3, 96, 15, 21]
    assert shapes[(1, 3, 97, 65)] == [1, 96, 25, 17]


# ClusTR: the batch comes from the input; height and width are fixed.
@pytest.fixture(scope='module')
def clustr_exact_graph(tmp_path_factory):
    """ClusTR-T (exact) exported at batch 1, 45 x 59 (odd), dynamic."""
    tmp = tmp_path_factory.mktemp('clustr_exact')
    report, out = export(
        tmp, dict(type='ClusTR', arch='tiny', clustering_mode='exact'),
        (45, 59), [(3, 45, 59)])
    return report, out


def test_clustr_t_exact_graph_takes_any_batch(clustr_exact_graph):
    report, out = clustr_exact_graph
    assert_all_close(report, [(1, 45, 59), (3, 45, 59)])
    assert not report['dynamic_hw']
    assert input_dims(out) == ['batch', 3, 45, 59]


def test_clustr_t_graph_refuses_other_sizes(clustr_exact_graph, tmp_path):
    """ONNX Runtime refuses another height or width (an error, not wrong
    outputs), and the tool refuses to check one."""
    _, out = clustr_exact_graph
    session = tool.ort_session(str(out))
    backbone = tool.TensorPath(
        MODELS.build(dict(type='ClusTR', arch='tiny')), None, 'model').eval()
    with pytest.raises(tool.ExportError, match='refused input'):
        tool.compare(backbone, session, [f'feat{i}' for i in range(4)],
                     (1, 3, 45, 61))
    with pytest.raises(tool.ExportError, match='takes only 45 x 59'):
        export(tmp_path, dict(type='ClusTR', arch='tiny'), (45, 59),
               [(1, 49, 59)])
    assert not list(tmp_path.iterdir())


def test_clustr_t_window_graph_at_detection_like_size(tmp_path):
    """Window mode at 800 x 1344's aspect, scaled down (104 x 168): every
    stage has border windows (26 x 42 tokens in 8 x 8 windows, 13 x 21 in
    4 x 4, 7 x 11 in 2 x 2); batch 1 and 3 through one graph."""
    report, out = export(
        tmp_path, dict(type='ClusTR', arch='tiny', clustering_mode='window',
                       window_size=8), (104, 168), [(3, 104, 168)])
    assert_all_close(report, [(1, 104, 168), (3, 104, 168)])
    assert input_dims(out) == ['batch', 3, 104, 168]


# A graph that disagrees with PyTorch is never written.
@MODELS.register_module(name='_BatchBakedForTest', force=True)
class BatchBaked(nn.Module):
    """Scales image i by i + 1, with the batch read as a Python int: a
    traced graph keeps the example's batch (exported at batch 1, it scales
    every image by 1: silently wrong for other batches)."""

    def forward(self, x):
        scale = torch.arange(1, int(x.shape[0]) + 1, dtype=x.dtype)
        return (x * scale.view(-1, 1, 1, 1), )


def test_disagreeing_graph_is_not_written(tmp_path):
    with pytest.raises(tool.ExportError, match='disagrees with PyTorch'):
        export(tmp_path, dict(type='_BatchBakedForTest'), (8, 8),
               [(3, 8, 8)])
    assert not list(tmp_path.iterdir())  # neither the file nor a temporary


def test_bad_arguments_are_refused(tmp_path):
    model = dict(type='_BatchBakedForTest')
    with pytest.raises(tool.ExportError, match='--tol must be > 0'):
        export(tmp_path, model, (8, 8), tol=0.0)
    with pytest.raises(tool.ExportError, match='needs --dynamic'):
        export(tmp_path, model, (8, 8), [(2, 8, 8)], dynamic=False)
    with pytest.raises(tool.ExportError, match='three positive ints'):
        export(tmp_path, model, (8, 8), [(0, 8, 8)])
    assert not list(tmp_path.iterdir())


def test_static_graph_refuses_other_shapes(tmp_path):
    small = dict(type='PaCaViT', arch=dict(
        embed_dims=(16, 16, 16, 16), num_heads=(1, 1, 1, 1),
        depths=(1, 1, 1, 1)))
    report, out = export(tmp_path, small, (32, 32), dynamic=False)
    assert input_dims(out) == [1, 3, 32, 32]
    session = tool.ort_session(str(out))
    backbone = tool.TensorPath(MODELS.build(small), None, 'model')
    with pytest.raises(tool.ExportError, match='refused input'):
        tool.compare(backbone.eval(), session, report['outputs'],
                     (2, 3, 32, 32))


# Whole models of the task libraries.
def task_export(tmp_path, config, shape, checks, **kwargs):
    out = tmp_path / 'model.onnx'
    report = tool.export_and_check(
        Config.fromfile(str(ROOT / config)), None, shape, str(out),
        dynamic=True, check_shapes=checks, log=lambda *a: None, **kwargs)
    return report, out


def test_segmentor_whole_image_logits(tmp_path):
    """mmseg: the decode head's logits resized to each input."""
    checks = [(3, 81, 113)]
    report, _ = task_export(
        tmp_path, 'configs/paca/pacahead_paca-t_embedded-ade20k.py',
        (64, 96), checks)
    assert report['outputs'] == ['seg_logits']
    assert_all_close(report, [(1, 64, 96)] + checks)
    shapes = [r['shape'] for r in report['checks']]
    assert shapes == [[1, 150, 64, 96], [3, 150, 81, 113]]


def test_detector_dense_outputs(tmp_path):
    """mmdet one-stage: the head's class scores and box deltas of the five
    levels (strides 8-128) at two batches and sizes."""
    checks = [(2, 96, 160)]
    report, _ = task_export(
        tmp_path, 'configs/paca/retinanet_paca-t_embedded-coco.py',
        (64, 128), checks)
    assert len(report['outputs']) == 10
    assert_all_close(report, [(1, 64, 128)] + checks)
    first = [r['shape'] for r in report['checks'] if r['output'] == 'output0']
    assert first == [[1, 9 * 80, 8, 16], [2, 9 * 80, 12, 20]]


@pytest.mark.slow
def test_cli_exports_classifier_logits(tmp_path):
    """The tool as a user runs it: an mmpretrain classifier's logits, one
    dynamic graph checked at two batches and sizes, the file written."""
    out = tmp_path / 'paca-t.onnx'
    proc = run_tool(['tools/deployment/pytorch2onnx.py',
                     'configs/paca/paca-t_8xb128_in1k.py', '--shape', '64',
                     '64', '--dynamic', '--check-shape', '3', '77', '65',
                     '--out', str(out)], timeout=300)
    rows = [ln for ln in proc.stdout.splitlines()
            if ' logits (' in ln and 'max |onnx' in ln]
    assert len(rows) == 2 and '(1, 1000)' in rows[0] and \
        '(3, 1000)' in rows[1], proc.stdout
    diffs = [float(ln.split('= ')[1].split()[0]) for ln in rows]
    assert max(diffs) <= TOL
    assert f'wrote {out}' in proc.stdout and out.is_file()
    assert input_dims(out) == ['batch', 3, 'height', 'width']

"""Mask R-CNN through mmdeploy and ONNX Runtime
(tools/deployment/mmdeploy_detection.py, docs/deployment.md).

The comparison of detections is unit-tested everywhere; the end-to-end
export runs in mmdeploy's side environment (the ``mmdeploy`` marker:
tools/run_tests.sh's ``mmdeploy`` stack, .venv-mmdeploy), and is skipped with
the reason elsewhere."""
import importlib.util

import numpy as np
import pytest
from conftest import load_tool, run_tool

TOOL = load_tool('mmdeploy_detection', folder='deployment')
HAS_MMDEPLOY = importlib.util.find_spec('mmdeploy') is not None


def _dets(boxes, scores, labels):
    return dict(bboxes=np.asarray(boxes, np.float32).reshape(-1, 4),
                scores=np.asarray(scores, np.float32),
                labels=np.asarray(labels, np.int64))


def test_matching_ignores_the_order_of_equal_scores():
    ref = _dets([[0, 0, 10, 10], [5, 5, 20, 20]], [0.5, 0.5], [1, 2])
    got = _dets([[5, 5, 20, 20.0005], [0, 0, 10, 10]], [0.50005, 0.5],
                [2, 1])
    result = TOOL.compare_detections(ref, got, 100, 1e-3, 1e-4)
    assert result['ok'] and result['compared'] == 2, result
    assert result['max_box_diff'] == pytest.approx(5e-4, abs=1e-5)


@pytest.mark.parametrize('change,why', [
    (dict(labels=[1, 3]), 'a label'),
    (dict(bboxes=[[0, 0, 10, 10], [5, 5, 20, 20.01]]), 'a box'),
    (dict(scores=[0.5, 0.49]), 'a score'),
])
def test_a_different_detection_is_found(change, why):
    ref = _dets([[0, 0, 10, 10], [5, 5, 20, 20]], [0.5, 0.5], [1, 2])
    got = dict(ref, **{k: np.asarray(v, ref[k].dtype).reshape(ref[k].shape)
                       for k, v in change.items()})
    result = TOOL.compare_detections(ref, got, 100, 1e-3, 1e-4)
    assert not result['ok'] and result['unmatched'] == 1, (why, result)


def test_a_missing_detection_is_found():
    ref = _dets([[0, 0, 10, 10], [5, 5, 20, 20]], [0.5, 0.4], [1, 2])
    got = _dets([[0, 0, 10, 10]], [0.5], [1])
    assert not TOOL.compare_detections(ref, got, 100, 1e-3, 1e-4)['ok']


def test_a_full_result_is_compared_above_its_cut():
    """keep_top_k = 3 reached: the detections at the lowest score may differ
    (near-equal scores decide which make the cut), the rest may not."""
    ref = _dets([[0, 0, 9, 9], [1, 1, 8, 8], [2, 2, 7, 7]], [0.9, 0.3, 0.1],
                [0, 1, 2])
    got = _dets([[0, 0, 9, 9], [1, 1, 8, 8], [3, 3, 6, 6]], [0.9, 0.3, 0.1],
                [0, 1, 5])
    result = TOOL.compare_detections(ref, got, 3, 1e-3, 1e-4)
    assert result['ok'] and result['compared'] == 2, result
    got['labels'][1] = 4  # above the cut: found
    assert not TOOL.compare_detections(ref, got, 3, 1e-3, 1e-4)['ok']


@pytest.mark.slow
@pytest.mark.mmdeploy
@pytest.mark.skipif(not HAS_MMDEPLOY, reason='needs mmdeploy: runs in '
                    'tools/deployment/setup_mmdeploy_env.sh\'s .venv-mmdeploy '
                    '(tools/run_tests.sh, stack mmdeploy)')
def test_paca_mask_rcnn_through_mmdeploy_equals_pytorch(tiny_data, tmp_path):
    """PaCa-T Mask R-CNN (random weights, seed 0) with the dynamic deploy
    config: NMS and RoIAlign in the graph, and ONNX Runtime's detections on
    two embedded validation images equal those of the exported PyTorch
    forward (boxes within 1e-3 px, scores within 1e-4, same labels); the
    difference to stock mmdet is reported. (ClusTR-T is checked by hand with
    trained weights, docs/deployment.md: untrained ClusTR clusters tokens at
    near-ties that round-off decides.)"""
    import json

    import onnx
    out = run_tool(['tools/deployment/mmdeploy_detection.py',
                    'configs/paca/mask-rcnn_paca-t_fpn_embedded-coco.py',
                    '--deploy-cfg',
                    'configs/deploy/mask-rcnn_onnxruntime_dynamic.py',
                    '--work-dir', str(tmp_path)], timeout=1200).stdout
    line = [ln for ln in out.splitlines() if ln.startswith('[mmdeploy] {')]
    assert line, out[-3000:]
    result = json.loads(line[-1].split(' ', 1)[1])
    assert result['ok'], result
    for image in result['images']:
        assert image['graph']['compared'] > 0, image
        assert 'unmatched' in image['mmdeploy_vs_mmdet'], image
    ops = {(n.domain, n.op_type)
           for n in onnx.load(str(tmp_path / 'end2end.onnx')).graph.node}
    assert {('', 'NonMaxSuppression'), ('', 'RoiAlign')} <= ops, sorted(ops)

"""The tiny embedded datasets (tools/data/make_tiny_data.py).

Generated once per session into a temporary folder, then checked for
determinism and loaded through each library's own dataset classes, loaders
and (for COCO and COCO-WholeBody) evaluators: ground truth fed back as
predictions must score a perfect AP. Learnability checks assert that the
labels can be read off the pixels (class colours at labelled places).
"""
import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / 'tools' / 'data' / 'make_tiny_data.py'


def _load_generator():
    spec = importlib.util.spec_from_file_location('make_tiny_data', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def _hashes(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(root).rglob('*')) if p.is_file()}


def _bgr(rgb):
    return np.array(rgb[::-1], dtype=np.float32)


@pytest.fixture(scope='session')
def data_root(tmp_path_factory):
    """All four datasets, generated in this process (the command line is
    tested by test_rerun_skips_complete_and_repairs_incomplete)."""
    out = tmp_path_factory.mktemp('tiny') / 'data'
    written = gen.generate(out, log=lambda *a: None)
    assert sorted(written) == sorted(gen.DATASETS)
    assert all(written.values()), written
    return out


# --------------------------------------------------------------------------
# The generator itself
# --------------------------------------------------------------------------

def test_deterministic(data_root, tmp_path):
    """A second run elsewhere writes byte-identical files."""
    written = gen.generate(tmp_path, log=lambda *a: None)
    assert all(written.values())
    first, second = _hashes(data_root), _hashes(tmp_path)
    assert first == second
    assert len(first) > 150


@pytest.mark.slow  # runs the command-line tool
def test_rerun_skips_complete_and_repairs_incomplete(data_root, tmp_path):
    before = {p: p.stat().st_mtime_ns for p in data_root.rglob('*') if p.is_file()}
    proc = subprocess.run([sys.executable, str(SCRIPT), '--out', str(data_root)],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.count('skipped') == len(gen.DATASETS), proc.stdout
    assert before == {p: p.stat().st_mtime_ns for p in data_root.rglob('*') if p.is_file()}

    # A missing file makes its dataset incomplete; only that one is rebuilt.
    gen.generate(tmp_path, only=['imagenet'], log=lambda *a: None)
    victim = tmp_path / 'imagenet' / 'meta' / 'val.txt'
    victim.unlink()
    assert not gen.is_complete(tmp_path, 'imagenet')
    written = gen.generate(tmp_path, only=['imagenet'], log=lambda *a: None)
    assert 'imagenet/meta/val.txt' in written['imagenet']
    assert victim.read_bytes() == (data_root / 'imagenet/meta/val.txt').read_bytes()
    assert gen.generate(tmp_path, only=['imagenet'], log=lambda *a: None) == {'imagenet': []}
    assert gen.generate(tmp_path, only=['imagenet'], force=True,
                        log=lambda *a: None)['imagenet']


# --------------------------------------------------------------------------
# COCO instances through mmdet
# --------------------------------------------------------------------------

def _coco_dataset(data_root, split, pipeline=()):
    from mmdet.datasets import CocoDataset
    return CocoDataset(
        data_root=str(data_root / 'coco') + '/',
        ann_file=f'annotations/instances_{split}2017.json',
        data_prefix=dict(img=f'{split}2017/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=32),
        pipeline=list(pipeline), test_mode=split == 'val')


def test_coco_instances_load_in_mmdet(data_root):
    from mmcv.transforms import LoadImageFromFile
    from mmdet.datasets import CocoDataset
    from mmdet.datasets.transforms import LoadAnnotations

    # The full category list, official ids in order, named as mmdet names them.
    assert [c[1] for c in gen.COCO_CATEGORIES] == list(CocoDataset.METAINFO['classes'])
    classes = CocoDataset.METAINFO['classes']
    id_to_label = {cid: i for i, (cid, _, _) in enumerate(gen.COCO_CATEGORIES)}

    pipeline = [LoadImageFromFile(), LoadAnnotations(with_bbox=True, with_mask=True)]
    for split, num in (('train', 16), ('val', 8)):
        ds = _coco_dataset(data_root, split, pipeline)
        assert len(ds) == num
        labels = set()
        for i in range(len(ds)):
            out = ds[i]
            img, boxes = out['img'], out['gt_bboxes'].tensor.numpy()
            masks, lab = out['gt_masks'].masks, out['gt_bboxes_labels']
            assert img.shape == (160, 192, 3)
            assert len(boxes) >= 2 and len(boxes) == len(masks) == len(lab)
            assert masks.shape[1:] == img.shape[:2]
            assert ((lab >= 0) & (lab < len(classes))).all()
            assert not out['gt_ignore_flags'].any()
            for box, mask, label in zip(boxes, masks, lab):
                labels.add(int(label))
                ys, xs = np.nonzero(mask)
                assert mask.sum() > 200
                assert xs.min() >= box[0] - 1 and xs.max() <= box[2] + 1
                assert ys.min() >= box[1] - 1 and ys.max() <= box[3] + 1
                # learnable: the pixels under the mask have the class colour
                cat_id = gen.COCO_CATEGORIES[int(label)][0]
                colour = _bgr(gen.COCO_OBJECTS[cat_id][1])
                assert np.abs(img[mask.astype(bool)].mean(0) - colour).max() < 20
        assert labels == {id_to_label[c] for c in gen.COCO_OBJECTS}


def test_coco_ground_truth_scores_perfect_ap(data_root):
    import torch
    from mmdet.datasets.transforms import LoadAnnotations
    from mmdet.evaluation import CocoMetric

    ds = _coco_dataset(data_root, 'val', [LoadAnnotations(with_bbox=True, with_mask=True)])
    metric = CocoMetric(ann_file=str(data_root / 'coco/annotations/instances_val2017.json'),
                        metric=['bbox', 'segm'])
    metric.dataset_meta = ds.metainfo
    for i in range(len(ds)):
        info = ds.get_data_info(i)
        out = ds.pipeline(dict(info, ori_shape=(info['height'], info['width'])))
        n = len(out['gt_bboxes_labels'])
        metric.process([{}], [dict(
            img_id=info['img_id'], ori_shape=(info['height'], info['width']),
            pred_instances=dict(
                bboxes=out['gt_bboxes'].tensor, scores=torch.ones(n),
                labels=torch.as_tensor(out['gt_bboxes_labels']),
                masks=torch.as_tensor(out['gt_masks'].masks).bool()))])
    results = metric.evaluate(len(ds))
    assert results['coco/bbox_mAP'] == pytest.approx(1.0)
    assert results['coco/segm_mAP'] == pytest.approx(1.0)


# --------------------------------------------------------------------------
# ADE20K through mmseg
# --------------------------------------------------------------------------

def test_ade20k_loads_in_mmseg(data_root):
    from mmcv.transforms import LoadImageFromFile
    from mmseg.datasets import ADE20KDataset
    from mmseg.datasets.transforms import LoadAnnotations

    classes = ADE20KDataset.METAINFO['classes']
    assert len(classes) == 150
    assert [classes[i] for i in sorted(gen.ADE_CLASSES)] == [
        'building', 'sky', 'tree', 'road', 'person', 'car']
    for split, num in (('training', 16), ('validation', 8)):
        ds = ADE20KDataset(
            data_root=str(data_root / 'ade/ADEChallengeData2016'),
            data_prefix=dict(img_path=f'images/{split}', seg_map_path=f'annotations/{split}'),
            reduce_zero_label=True,
            pipeline=[LoadImageFromFile(), LoadAnnotations()])
        assert len(ds) == num
        seen = set()
        for i in range(len(ds)):
            out = ds[i]
            img, seg = out['img'], out['gt_seg_map']
            assert img.shape == (144, 192, 3) and seg.shape == (144, 192)
            assert seg.dtype == np.uint8
            values = set(np.unique(seg).tolist())
            assert values <= set(range(150)) | {255}
            assert 255 in values  # the 'other' region, ignored
            seen |= values
            for cls in values - {255}:  # learnable: each class has its colour
                colour = _bgr(gen.ADE_CLASSES[cls])
                assert np.abs(img[seg == cls].mean(0) - colour).max() < 25, cls
        assert seen == set(gen.ADE_CLASSES) | {255}


# --------------------------------------------------------------------------
# COCO-WholeBody through mmpose
# --------------------------------------------------------------------------

def _wholebody(data_root, split, pipeline=(), **kwargs):
    from mmpose.datasets import CocoWholeBodyDataset
    return CocoWholeBodyDataset(
        data_root=str(data_root / 'coco') + '/',
        ann_file=f'annotations/coco_wholebody_{split}_v1.0.json',
        data_prefix=dict(img=f'{split}2017/'), data_mode='topdown',
        pipeline=list(pipeline), **kwargs)


def test_coco_wholebody_loads_in_mmpose(data_root):
    from mmpose.datasets.transforms import GetBBoxCenterScale, LoadImage, TopdownAffine

    ds = _wholebody(data_root, 'train', [LoadImage(), GetBBoxCenterScale(),
                                         TopdownAffine(input_size=(192, 256))])
    assert len(ds) == 16
    assert ds.metainfo['num_keypoints'] == 133
    assert ds.metainfo['CLASSES'][0]['name'] == 'person'
    colours = gen.keypoint_colours()
    # body joints and feet whose dot is not overdrawn by a face or hand dot
    checked = [5, 6, 7, 8, 11, 12, 13, 14, 15, 16] + list(range(17, 23))
    for i in range(len(ds)):
        info = ds.get_data_info(i)
        assert info['keypoints'].shape == (1, 133, 2)
        assert info['keypoints_visible'].shape == (1, 133)
        assert info['keypoints_visible'].all() and info['num_keypoints'] == 17
        raw = info['raw_ann_info']
        for part, size in gen.PART_SIZES.items():
            assert len(raw[part]) == 3 * size
        for key in ('face_box', 'lefthand_box', 'righthand_box', 'bbox'):
            assert len(raw[key]) == 4 and raw[key][2] > 0 and raw[key][3] > 0
        assert raw['face_valid'] and raw['lefthand_valid'] and raw['righthand_valid']
        x0, y0, x1, y1 = info['bbox'][0]
        kpts = info['keypoints'][0]
        assert (kpts[:, 0] >= x0).all() and (kpts[:, 0] <= x1).all()
        assert (kpts[:, 1] >= y0).all() and (kpts[:, 1] <= y1).all()

        out = ds[i]
        assert out['img'].shape == (256, 192, 3)
        assert out['transformed_keypoints'].shape == (1, 133, 2)
        # learnable: each joint is a dot of its own colour at its location
        from mmcv import imread
        img = imread(info['img_path']).astype(np.float32)
        for k in checked:
            x, y = np.rint(kpts[k]).astype(int)
            assert np.abs(img[y, x] - _bgr(colours[k])).max() < 60, (i, k)

    val = _wholebody(data_root, 'val', test_mode=True, bbox_file=str(
        data_root / 'coco/person_detection_results/COCO_val2017_detections_AP_H_56_person.json'))
    assert len(val) == 8
    det = val.get_data_info(0)
    assert det['bbox'].shape == (1, 4) and 0.9 <= float(det['bbox_score'][0]) <= 1.0


def test_coco_wholebody_ground_truth_scores_perfect_ap(data_root, capsys):
    from mmpose.evaluation import CocoWholeBodyMetric

    ds = _wholebody(data_root, 'val', test_mode=True)
    assert len(ds) == 8
    metric = CocoWholeBodyMetric(
        ann_file=str(data_root / 'coco/annotations/coco_wholebody_val_v1.0.json'))
    metric.dataset_meta = ds.metainfo
    for i in range(len(ds)):
        info = ds.get_data_info(i)
        metric.process([{}], [dict(
            id=info['id'], img_id=info['img_id'], category_id=1,
            ori_shape=(256, 192), raw_ann_info=info['raw_ann_info'],
            pred_instances=dict(keypoints=info['keypoints'],
                                keypoint_scores=np.ones((1, 133), np.float32),
                                bbox_scores=np.ones(1, np.float32)),
            gt_instances=dict(bbox_scales=np.ones((1, 2), np.float32),
                              bbox_scores=np.ones(1, np.float32)))])
    capsys.readouterr()
    results = metric.evaluate(len(ds))
    assert results['coco-wholebody/AP'] == pytest.approx(1.0)
    # xtcocotools evaluates each part in turn; it only prints their scores
    log = capsys.readouterr().out
    for part in ('body', 'foot', 'face', 'lefthand', 'righthand', 'wholebody'):
        block = log.split(f'*keypoints_{part}*')[1]
        first_ap = next(line for line in block.splitlines() if 'Average Precision' in line)
        assert float(first_ap.rsplit('=', 1)[1]) == pytest.approx(1.0), (part, first_ap)


# --------------------------------------------------------------------------
# ImageNet through mmpretrain
# --------------------------------------------------------------------------

def test_imagenet_loads_in_mmpretrain(data_root):
    from mmcv.transforms import LoadImageFromFile
    from mmpretrain.datasets import ImageNet

    colours = np.stack([_bgr(c[2]) for c in gen.IMAGENET_CLASSES.values()])
    for split, num in (('train', 32), ('val', 16)):
        # as the stock imagenet_bs64 config, and with explicit paths
        by_split = ImageNet(data_root=str(data_root / 'imagenet'), split=split,
                            pipeline=[LoadImageFromFile()])
        explicit = ImageNet(data_root=str(data_root / 'imagenet'),
                            ann_file=f'meta/{split}.txt', data_prefix=split)
        assert len(by_split) == len(explicit) == num
        assert len(by_split.metainfo['classes']) == 1000
        labels = [by_split.get_data_info(i)['gt_label'] for i in range(num)]
        assert labels == [explicit.get_data_info(i)['gt_label'] for i in range(num)]
        assert sorted(set(labels)) == [0, 1, 2, 3]
        assert labels.count(0) == num // 4
        for i in range(num):
            out = by_split[i]
            img = out['img'].astype(np.float32)
            assert img.shape == (128, 128, 3)
            assert Path(out['img_path']).is_file()
            # learnable: the class colour covers more pixels than any other
            dist = np.abs(img[:, :, None, :] - colours[None, None]).max(-1)
            assert int(np.argmax((dist < 40).sum((0, 1)))) == out['gt_label']
    wnid = gen.IMAGENET_CLASSES[0][0]
    assert (data_root / 'imagenet/train' / wnid).is_dir()


# --------------------------------------------------------------------------
# The stock OpenMMLab configs read the data where it is, with their own
# full train and test pipelines
# --------------------------------------------------------------------------

STOCK_CONFIGS = {
    'mmdet': 'mmdet::_base_/datasets/coco_instance.py',
    'mmseg': 'mmseg::_base_/datasets/ade20k.py',
    'mmpose': 'mmpose::wholebody_2d_keypoint/topdown_heatmap/coco-wholebody/'
              'td-hm_hrnet-w32_8xb64-210e_coco-wholebody-256x192.py',
    'mmpretrain': 'mmpretrain::_base_/datasets/imagenet_bs64.py',
}
STOCK_SIZES = {'mmdet': (16, 8), 'mmseg': (16, 8), 'mmpose': (16, 8),
               'mmpretrain': (32, 16)}


def _relocate(cfg, root):
    """Point every 'data/...' path of a config at the generated root."""
    if isinstance(cfg, dict):
        return type(cfg)({k: _relocate(v, root) for k, v in cfg.items()})
    if isinstance(cfg, (list, tuple)):
        return type(cfg)(_relocate(v, root) for v in cfg)
    if isinstance(cfg, str) and cfg.startswith('data/'):
        return str(root / cfg[len('data/'):]) + ('/' if cfg.endswith('/') else '')
    return cfg


@pytest.mark.parametrize('scope', sorted(STOCK_CONFIGS))
def test_stock_config_reads_tiny_data(scope, data_root, tmp_path):
    import importlib

    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    base = tmp_path / 'stock.py'
    base.write_text(f"_base_ = ['{STOCK_CONFIGS[scope]}']\n")
    cfg = Config.fromfile(str(base))
    init_default_scope(scope)
    importlib.import_module(f'{scope}.datasets')
    datasets = importlib.import_module(f'{scope}.registry').DATASETS
    for loader, num in zip(('train_dataloader', 'val_dataloader'), STOCK_SIZES[scope]):
        ds = datasets.build(_relocate(cfg[loader]['dataset'].to_dict(), data_root))
        assert len(ds) == num
        sample = ds[0]
        assert sample['inputs'].ndim == 3 and sample['inputs'].shape[0] == 3
        assert 'data_samples' in sample
    ann_file = cfg.val_evaluator.get('ann_file')
    if ann_file:
        assert Path(_relocate(ann_file, data_root)).is_file()


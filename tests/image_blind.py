"""Image-blind baselines of the embedded data's learning tests: what a
predictor that never looks at the image scores with the same metric on the
same validation images. A trained model must beat it by a margin; the
learning tests measure it beside their runs (nothing is trained here, it
takes a second).

- ADE20K: every pixel gets the class most often found at that position in
  the training label maps (sky on top, road below: a strong blind guess on
  this data), scored by mmseg's ``IoUMetric`` (mIoU, %).
- COCO instances: every validation image gets all the training boxes (and
  box-filled masks) with their classes and score 1, scored by mmdet's
  ``CocoMetric`` (bbox mAP50, segm mAP, 0-1).
"""
import json
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ADE = Path('ade/ADEChallengeData2016/annotations')
COCO = Path('coco/annotations')


def _ade_labels(root: Path, split: str):
    """The label maps of ``split`` as mmseg reads them for ADE20K
    (reduce_zero_label: class c stored as c + 1, 0 'other' ignored: 255)."""
    maps = []
    for path in sorted((root / ADE / split).glob('*.png')):
        label = np.asarray(Image.open(path)).astype(np.int64) - 1
        label[label < 0] = 255
        maps.append(label)
    return maps


def segmentation(root) -> float:
    """mIoU (%) on the embedded ADE20K validation set of the per-pixel most
    frequent training class."""
    from mmseg.evaluation import IoUMetric
    train = np.stack(_ade_labels(Path(root), 'training'))  # one image size
    counts = np.zeros((150, ) + train.shape[1:], dtype=np.int64)
    for label in train:
        valid = label != 255
        np.add.at(counts, (label[valid], *np.nonzero(valid)), 1)
    blind = np.where(counts.sum(0) > 0, counts.argmax(0), 255)
    metric = IoUMetric(iou_metrics=['mIoU'])
    metric.dataset_meta = dict(classes=[str(i) for i in range(150)])
    for label in _ade_labels(Path(root), 'validation'):
        metric.process([], [dict(
            pred_sem_seg=dict(data=torch.from_numpy(blind)[None]),
            gt_sem_seg=dict(data=torch.from_numpy(label)[None]))])
    return metric.compute_metrics(metric.results)['mIoU']


def detection(root) -> dict:
    """{'coco/bbox_mAP_50', 'coco/segm_mAP'} (0-1) on the embedded COCO
    validation set of every training box placed on every image."""
    from mmdet.datasets import CocoDataset
    from mmdet.evaluation import CocoMetric
    root = Path(root)
    train = json.loads((root / COCO / 'instances_train2017.json').read_text())
    val_file = root / COCO / 'instances_val2017.json'
    label = {c['id']: i for i, c in enumerate(train['categories'])}
    boxes = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in
                          (a['bbox'] for a in train['annotations'])])
    labels = torch.tensor([label[a['category_id']]
                           for a in train['annotations']])
    metric = CocoMetric(ann_file=str(val_file), metric=['bbox', 'segm'])
    metric.dataset_meta = dict(classes=CocoDataset.METAINFO['classes'])
    for img in json.loads(val_file.read_text())['images']:
        h, w = img['height'], img['width']
        masks = torch.zeros(len(boxes), h, w, dtype=torch.bool)
        for mask, (x0, y0, x1, y1) in zip(masks, boxes.round().long()):
            mask[y0:y1, x0:x1] = True
        metric.process({}, [dict(
            img_id=img['id'], ori_shape=(h, w), pred_instances=dict(
                bboxes=boxes.float(), scores=torch.ones(len(boxes)),
                labels=labels, masks=masks))])
    result = metric.compute_metrics(metric.results)
    return {f'coco/{k}': result[k] for k in ('bbox_mAP_50', 'segm_mAP')}

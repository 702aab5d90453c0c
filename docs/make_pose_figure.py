"""Draw the embedded pose run's prediction beside its clusters (the picture
in docs/embedded_data.md):

    python tools/analysis/learning_check.py \
        configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py --metric PCK \
        --work-dir work_dirs/pose_embedded --cfg-options randomness.seed=0
    python docs/make_pose_figure.py work_dirs/pose_embedded/epoch_60.pth

The first validation figure goes through the config's own test pipeline
(ground-truth box, 64x48 crop); the model predicts its 133 keypoints, and
``visualize_clusters.py``'s renderer draws the backbone's DPC-kNN clusters of
the same crop, one row per stage, with the predicted keypoints on the crop at
the left of each row (dots in the colour the generator painted that keypoint
with, so a dot on its painted twin is a hit).
"""
import argparse
import json
import os.path as osp
import sys

import numpy as np
import torch
from PIL import Image, ImageDraw

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path[:0] = [ROOT, osp.join(ROOT, 'tools', 'analysis'),
                osp.join(ROOT, 'tools', 'data')]

import visualize_clusters as vc  # noqa: E402
from tiny_data.wholebody import keypoint_colours  # noqa: E402

CONFIG = 'configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py'
PARTS = ('keypoints', 'foot_kpts', 'face_kpts', 'lefthand_kpts',
         'righthand_kpts')
UPSCALE = 4  # the 64x48 crop is drawn at 256x192


def first_val_person(data_root):
    """(image path, box xyxy, keypoints (133, 2)) of the first val person."""
    ann = json.load(open(osp.join(
        data_root, 'coco', 'annotations', 'coco_wholebody_val_v1.0.json')))
    a = ann['annotations'][0]
    image = next(i for i in ann['images'] if i['id'] == a['image_id'])
    x, y, w, h = a['bbox']
    kpts = np.concatenate([np.reshape(a[p], (-1, 3))[:, :2] for p in PARTS])
    return (osp.join(data_root, 'coco', 'val2017', image['file_name']),
            np.array([x, y, x + w, y + h], dtype=np.float32), kpts)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('checkpoint', help='the embedded run\'s checkpoint')
    parser.add_argument('--data', default=osp.join(ROOT, 'data'))
    parser.add_argument('--out', default=osp.join(
        ROOT, 'docs', 'pose_clusters_clustr-t_embedded.png'))
    args = parser.parse_args(argv)

    from mmengine.dataset import Compose, pseudo_collate
    from mmengine.registry import init_default_scope
    from mmpose.apis import init_model
    import clustr_mm  # noqa: F401
    torch.manual_seed(0)
    model = init_model(osp.join(ROOT, CONFIG), args.checkpoint, device='cpu')
    init_default_scope('mmpose')
    path, box, truth = first_val_person(args.data)
    info = dict(img_path=path, bbox=box[None],
                bbox_score=np.ones(1, dtype=np.float32))
    info.update(model.dataset_meta)
    batch = pseudo_collate(
        [Compose(model.cfg.test_dataloader.dataset.pipeline)(info)])
    with torch.no_grad():
        sample = model.test_step(batch)[0]
        x = model.data_preprocessor(batch)['inputs']
    records = vc.collect_assignments(model.backbone, x)

    # the crop the model saw, and the keypoints in its pixels
    crop = batch['inputs'][0].flip(0).permute(1, 2, 0).numpy()  # BGR -> RGB
    size = np.array(crop.shape[1::-1], dtype=np.float64)  # (w, h)
    centre = sample.metainfo['input_center']
    scale = sample.metainfo['input_scale']

    def to_crop(points):
        return ((points - centre) / scale + 0.5) * size * UPSCALE

    pred = sample.pred_instances.keypoints[0]
    hits = (np.linalg.norm(pred - truth, axis=1)
            <= 0.05 * np.max(box[2:] - box[:2]))
    image = Image.fromarray(np.ascontiguousarray(crop)).resize(
        tuple(int(v) for v in size * UPSCALE), Image.BILINEAR)
    draw = ImageDraw.Draw(image)
    for (u, v), colour, k in zip(to_crop(pred), keypoint_colours(), range(133)):
        r = 2.5 if k < 23 else 1.5  # body and feet bigger, as painted
        draw.ellipse([u - r, v - r, u + r, v + r], fill=colour,
                     outline=(0, 0, 0))
    title = (f'ClusTR-T pose, embedded run ({osp.basename(args.checkpoint)}):'
             f' {int(hits.sum())}/133 keypoints hit')
    picture, _ = vc.render(image, records, tile=image.width, title=title)
    picture.save(args.out, optimize=True)
    print(f'wrote {args.out} ({picture.width}x{picture.height}); '
          f'{int(hits.sum())}/133 keypoints within PCK@0.05')


if __name__ == '__main__':
    main()

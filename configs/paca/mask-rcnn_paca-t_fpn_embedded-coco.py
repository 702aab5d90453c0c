# Mask R-CNN + PaCa-ViT-T on the tiny embedded COCO data
# (../_base_/mask-rcnn_fpn_embedded-coco.py): single-scale 256x256 inputs
# (the release's multi-scale/crop augmentation needs 480-800 pixel images)
# and a short schedule, from random weights. The learning check
# (configs/paca/README.md) runs it.
_base_ = '../_base_/mask-rcnn_fpn_embedded-coco.py'

model = dict(
    backbone=dict(
        type='PaCaViT',
        arch='tiny',
        clustering='conv'),
    neck=dict(in_channels=[96, 192, 320, 384]))

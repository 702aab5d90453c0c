# RetinaNet + PaCa-ViT-T on the tiny embedded COCO data
# (../_base_/retinanet_fpn_embedded-coco.py): trains and evaluates in minutes
# on a CPU, from random weights.
_base_ = '../_base_/retinanet_fpn_embedded-coco.py'

model = dict(
    backbone=dict(
        type='PaCaViT',
        arch='tiny',
        clustering='conv'),
    neck=dict(in_channels=[192, 320, 384]))

# Mask R-CNN + ClusTR-T on the tiny embedded COCO data
# (../_base_/mask-rcnn_fpn_embedded-coco.py): trains and evaluates in minutes
# on a CPU, from random weights, with the ClusTR recipe's optimizer.
_base_ = '../_base_/mask-rcnn_fpn_embedded-coco.py'

model = dict(
    backbone=dict(
        type='ClusTR',
        arch='tiny',
        # windowed DPC-kNN, as at full detection sizes
        clustering_mode='window'),
    neck=dict(in_channels=[64, 128, 256, 512]))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, betas=(0.9, 0.999),
                   weight_decay=1e-4))

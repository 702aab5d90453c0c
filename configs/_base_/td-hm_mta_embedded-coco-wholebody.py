# Whole-body top-down pose in the paper's model
# (./td-hm_mta-8xb64-210e_coco-wholebody-256x192.py) on the tiny embedded
# COCO-WholeBody (tools/data/make_tiny_data.py), sized for a CPU: 64x48
# inputs, 16x12 heatmaps (sigma 1: the 256x192 setting's sigma 2 on 64x48
# heatmaps, scaled), 60 epochs of 2 iterations. Validation uses the
# ground-truth boxes, so that mmpose's PCKAccuracy (PCK@0.05 of the box
# size, all 133 keypoints) is computed beside the whole-body AP. A config
# adds its backbone (from random weights) and the neck's in_channels.
_base_ = './td-hm_mta-8xb64-210e_coco-wholebody-256x192.py'

codec = dict(
    type='MSRAHeatmap', input_size=(48, 64), heatmap_size=(12, 16), sigma=1)
model = dict(
    # from random weights (no ImageNet checkpoint on a fresh machine)
    backbone=dict(drop_path_rate=0.0, init_cfg=None),
    head=dict(decoder=codec),
    test_cfg=dict(flip_test=False))
train_pipeline = [
    dict(type='LoadImage'),
    dict(type='GetBBoxCenterScale'),
    dict(type='RandomFlip', direction='horizontal'),
    dict(type='TopdownAffine', input_size=codec['input_size']),
    dict(type='GenerateTarget', encoder=codec),
    dict(type='PackPoseInputs'),
]
val_pipeline = [
    dict(type='LoadImage'),
    dict(type='GetBBoxCenterScale'),
    dict(type='TopdownAffine', input_size=codec['input_size']),
    dict(type='PackPoseInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=val_pipeline, bbox_file=None))
test_dataloader = val_dataloader
val_evaluator = [
    dict(type='CocoWholeBodyMetric',
         ann_file='data/coco/annotations/coco_wholebody_val_v1.0.json'),
    dict(type='PCKAccuracy', thr=0.05, norm_item='bbox'),
]
test_evaluator = val_evaluator

max_epochs = 60
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
# From scratch: lr 1e-3 (2e-3 made the heatmap loss jump eightfold in the
# first epochs), a 10-iteration warm-up, x0.1 for the last 10 epochs.
optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='LinearLR', begin=0, end=10, start_factor=0.1, by_epoch=False),
    dict(type='MultiStepLR', begin=0, end=max_epochs, milestones=[50],
         gamma=0.1, by_epoch=True),
]
auto_scale_lr = dict(enable=False)
default_hooks = dict(
    logger=dict(interval=2),
    checkpoint=dict(interval=max_epochs, max_keep_ckpts=1, save_best=None))

# Whole-body top-down pose + ClusTR-T on the tiny embedded COCO-WholeBody:
# 128x96 inputs (32x24 heatmaps) and a short schedule for a CPU.
_base_ = './td-hm_clustr-s_8xb64-210e_coco-wholebody-256x192.py'

codec = dict(
    type='MSRAHeatmap', input_size=(96, 128), heatmap_size=(24, 32), sigma=2)
model = dict(
    backbone=dict(arch='tiny', drop_path_rate=0.0, init_cfg=None),
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
    dataset=dict(pipeline=val_pipeline))
test_dataloader = val_dataloader

max_epochs = 40
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
optim_wrapper = dict(optimizer=dict(lr=2e-3))
param_scheduler = [
    dict(type='LinearLR', begin=0, end=5, start_factor=0.1, by_epoch=False),
    dict(type='MultiStepLR', begin=0, end=max_epochs, milestones=[35],
         gamma=0.1, by_epoch=True),
]
default_hooks = dict(
    logger=dict(interval=2),
    checkpoint=dict(interval=max_epochs, max_keep_ckpts=1, save_best=None))

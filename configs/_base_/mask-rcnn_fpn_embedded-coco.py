# Mask R-CNN on the tiny embedded COCO data (tools/data/make_tiny_data.py):
# single-scale 256x256 inputs and a short schedule so it trains and
# evaluates in minutes on a CPU. A config adds its backbone (from random
# weights: no ImageNet checkpoint exists on a fresh machine).
_base_ = './mask-rcnn_fpn_1x_coco.py'

scale = (256, 256)
model = dict(
    # from random weights (no ImageNet checkpoint on a fresh machine)
    backbone=dict(drop_path_rate=0.0, init_cfg=None),
    # Keep low-score detections: early in training every score is low, and
    # COCO evaluation of an empty result list reports nothing.
    test_cfg=dict(rcnn=dict(score_thr=0.001)))
train_pipeline = [
    dict(t, scale=scale) if t['type'] == 'Resize' else t
    for t in _base_.train_pipeline
]
test_pipeline = [
    dict(t, scale=scale) if t['type'] == 'Resize' else t
    for t in _base_.test_pipeline
]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=train_pipeline, filter_cfg=dict(min_size=4)))
val_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

max_epochs = 12
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=20),
    dict(type='MultiStepLR', begin=0, end=max_epochs, by_epoch=True,
         milestones=[9, 11], gamma=0.1),
]
default_hooks = dict(
    logger=dict(interval=4),
    checkpoint=dict(interval=max_epochs, max_keep_ckpts=1))

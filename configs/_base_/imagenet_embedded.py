# The tiny embedded ImageNet (tools/data/make_tiny_data.py: 4 classes, 64x64
# crops) with a short plain schedule (no RandAugment / Mixup) that trains in
# minutes on a CPU. A config adds its backbone and the head's in_channels.
_base_ = './imagenet_8xb128-300e.py'

model = dict(train_cfg=None)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResizedCrop', scale=64, crop_ratio_range=(0.5, 1.0),
         backend='pillow', interpolation='bicubic'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=64, edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]
train_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=8, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

max_epochs = 8
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=4),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=True, begin=0,
         end=max_epochs),
]
optim_wrapper = dict(optimizer=dict(lr=1e-3))
default_hooks = dict(
    logger=dict(interval=2),
    checkpoint=dict(interval=1, max_keep_ckpts=2))

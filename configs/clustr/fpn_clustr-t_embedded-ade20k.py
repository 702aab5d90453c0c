# Semantic FPN + ClusTR-T on the tiny embedded ADE20K: 128x128 crops and a
# short schedule so it trains and evaluates in minutes on a CPU.
_base_ = './fpn_clustr-s_8xb2-80k_ade20k-512x512.py'

crop_size = (128, 128)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(arch='tiny', drop_path_rate=0.0, init_cfg=None))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(256, 128), ratio_range=(0.75, 1.5),
         keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

max_iters = 40
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
optim_wrapper = dict(optimizer=dict(lr=1e-3))
param_scheduler = [
    dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=max_iters,
         by_epoch=False)
]
default_hooks = dict(
    logger=dict(interval=5),
    checkpoint=dict(interval=max_iters, max_keep_ckpts=1))

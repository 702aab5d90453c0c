# PaCa segmentation head + PaCa-ViT-T (200 clusters per stage) on the tiny
# embedded ADE20K: 128x128 crops and a short schedule so it trains in minutes
# on a CPU, from random weights. The outcome depends on the seed (about one
# seed in three stalls low: configs/paca/README.md); pass
# --cfg-options randomness.seed=0 for the run the tests check.
_base_ = './pacahead_paca-t_8xb2-160k_ade20k-512x512.py'

crop_size = (128, 128)
small_sizes = dict(
    RandomResize=dict(scale=(256, 128), ratio_range=(0.75, 1.5)),
    RandomCrop=dict(crop_size=crop_size),
    Resize=dict(scale=(256, 128)))
train_pipeline = [dict(t, **small_sizes.get(t['type'], {}))
                  for t in _base_.train_pipeline
                  if t['type'] != 'PhotoMetricDistortion']
test_pipeline = [dict(t, **small_sizes.get(t['type'], {}))
                 for t in _base_.test_pipeline]
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(drop_path_rate=0.0, init_cfg=None))
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

max_iters = 40
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
# lr 1e-3 everywhere: the recipe's x10 on the head (1e-2 with AdamW) is too
# large a step for a from-scratch run this short.
optim_wrapper = dict(
    optimizer=dict(lr=1e-3),
    paramwise_cfg=dict(custom_keys={
        'head': dict(lr_mult=1.),
        'clustering.to_clusters': dict(lr_mult=1.),
    }))
param_scheduler = [
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=0, end=max_iters,
         by_epoch=False)
]
default_hooks = dict(
    logger=dict(interval=5),
    checkpoint=dict(interval=max_iters, max_keep_ckpts=1))

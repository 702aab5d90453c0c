# UperNet on the tiny embedded ADE20K (tools/data/make_tiny_data.py): 128x128
# crops and a short schedule so it trains in minutes on a CPU. A config adds
# its backbone (from random weights).
_base_ = './upernet_8xb2-160k_ade20k-512x512.py'

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
    # from random weights (no ImageNet checkpoint on a fresh machine)
    backbone=dict(drop_path_rate=0.0, init_cfg=None),
    data_preprocessor=dict(size=crop_size))
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
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=0, end=max_iters,
         by_epoch=False)
]
default_hooks = dict(
    logger=dict(interval=5),
    checkpoint=dict(interval=max_iters, max_keep_ckpts=1))

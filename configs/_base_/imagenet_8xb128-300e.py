# ImageNet-1K from scratch, the recipe both families share: 300 epochs of the
# DeiT/PVTv2 recipe (AdamW lr 1e-3 at batch 1024 = 8 GPUs x 128, wd 0.05,
# RandAugment, Mixup/CutMix, random erasing, label smoothing 0.1), with the
# official scripts' learning-rate curve (timm's cosine over all 300 epochs, 5
# linear warm-up epochs stepped per epoch: WarmupCosineLR) and PIL decoding
# in evaluation. A config adds its backbone and the head's in_channels
# (configs/official_recipes.yml: what each release adds).
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
    './default_runtime.py',
]

model = dict(
    type='ImageClassifier',
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        init_cfg=None,
        loss=dict(
            type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        cal_acc=False),
    init_cfg=[
        dict(type='TruncNormal', layer='Linear', std=0.02, bias=0.),
        dict(type='Constant', layer='LayerNorm', val=1., bias=0.),
    ],
    train_cfg=dict(augments=[
        dict(type='Mixup', alpha=0.8),
        dict(type='CutMix', alpha=1.0),
    ]),
)

train_dataloader = dict(batch_size=128)
test_pipeline = [
    dict(type='LoadImageFromFile', imdecode_backend='pillow'),
    dict(type='ResizeEdge', scale=256, edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
val_dataloader = dict(batch_size=128, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

# the cosine spans the run (its end: train_cfg.max_epochs)
param_scheduler = [
    dict(type='WarmupCosineLR', warmup_epochs=5, warmup_factor=1e-3,
         eta_min=1e-5),
]
auto_scale_lr = dict(base_batch_size=1024)

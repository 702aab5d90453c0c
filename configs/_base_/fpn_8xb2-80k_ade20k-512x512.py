# Semantic FPN 80k on ADE20K, what both families share: the ClusTR paper's
# recipe (AdamW lr 1e-4, wd 1e-4, poly 0.9 decaying to 0, batch 16 = 8 GPUs
# x 2), composed from mmseg's base pieces (mmseg ships no Semantic FPN ADE20K
# 80k config). A config replaces the backbone (with _delete_) and sets the
# neck's in_channels and its ImageNet checkpoint.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
    './default_runtime.py',
]

crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,  # the base sets a ResNet checkpoint on the model
    # fine-tuned from an ImageNet classifier's weights (a config names the
    # backbone and its imagenet_checkpoint)
    backbone=dict(
        _delete_=True,
        init_cfg=dict(type='Pretrained', prefix='backbone.')),
    decode_head=dict(num_classes=150))

train_dataloader = dict(batch_size=2)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                   weight_decay=1e-4))
param_scheduler = [
    dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=80000,
         by_epoch=False)
]

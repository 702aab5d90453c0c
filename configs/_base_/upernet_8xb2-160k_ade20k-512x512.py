# UperNet 160k on ADE20K, what both families share: AdamW lr 6e-5, wd 0.01,
# 1500 linear warm-up iterations, then poly 1.0 to 0; batch 16 = 8 GPUs x 2
# (the ClusTR paper's and the PaCa-ViT release's recipe). A config replaces
# the backbone (with _delete_) and sets the heads' in_channels and its
# ImageNet checkpoint.
_base_ = [
    'mmseg::_base_/models/upernet_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
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
    decode_head=dict(num_classes=150),
    auxiliary_head=dict(num_classes=150))

train_dataloader = dict(batch_size=2)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=6e-5, betas=(0.9, 0.999),
                   weight_decay=0.01))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0,
         end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000,
         by_epoch=False),
]

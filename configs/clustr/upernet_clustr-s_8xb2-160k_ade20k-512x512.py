# UperNet 160k on ADE20K with ClusTR-S (paper recipe: AdamW lr 6e-5, wd 0.01,
# 1500 linear warm-up iterations, then poly 1.0 to 0; batch 16 = 8 GPUs x 2).
_base_ = [
    'mmseg::_base_/models/upernet_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]
custom_imports = dict(imports=['clustr_mm'], allow_failed_imports=False)
# Resume continues the random streams; a non-finite loss stops the run before
# it is saved (clustr_mm/engine).
custom_hooks = [dict(type='RandomStateHook'), dict(type='FailFastHook')]

imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'

crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,  # the base sets a ResNet checkpoint on the model
    backbone=dict(
        _delete_=True,
        type='ClusTR',
        arch='small',
        clustering_mode='window',
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained', checkpoint=imagenet_checkpoint,
            prefix='backbone.')),
    decode_head=dict(in_channels=[64, 128, 256, 512], num_classes=150),
    auxiliary_head=dict(in_channels=256, num_classes=150))

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

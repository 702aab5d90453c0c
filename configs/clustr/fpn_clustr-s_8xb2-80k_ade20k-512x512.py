# Semantic FPN 80k on ADE20K with ClusTR-S (paper recipe: AdamW lr 1e-4, wd 1e-4,
# poly 0.9 decaying to 0, batch 16 = 8 GPUs x 2). mmseg ships no Semantic FPN
# ADE20K 80k config, so it is composed from mmseg's base pieces.
_base_ = [
    'mmseg::_base_/models/fpn_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
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
    neck=dict(in_channels=[64, 128, 256, 512]),
    decode_head=dict(num_classes=150))

train_dataloader = dict(batch_size=2)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                   weight_decay=1e-4))
# The base schedule's eta_min=1e-4 would keep lr 1e-4 constant: decay to 0.
param_scheduler = [
    dict(type='PolyLR', eta_min=0.0, power=0.9, begin=0, end=80000,
         by_epoch=False)
]

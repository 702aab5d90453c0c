# Whole-body pose as the ClusTR paper trained it ("the same settings as
# TCFormer", both families): all four backbone stages through
# MultiStageAggregation, a 1x1 head at stride 4; AdamW lr 5e-4, betas (0.9,
# 0.999), wd 0.01, 500 warm-up iterations, x0.1 at epochs 170 and 200, 210
# epochs, 8 GPUs x 64 images; mmpose's HRNet-W32 config for the data,
# codec (sigma 2) and evaluation. A config replaces the backbone (with
# _delete_, out_indices (0, 1, 2, 3)) and sets the neck's in_channels and
# its ImageNet checkpoint.
_base_ = [
    'mmpose::wholebody_2d_keypoint/topdown_heatmap/coco-wholebody/'
    'td-hm_hrnet-w32_8xb64-210e_coco-wholebody-256x192.py'
]
# clustr_mm's runtime (../_base_/default_runtime.py) beside mmpose's
# SyncBuffersHook, which the base's custom_hooks hold
custom_imports = dict(imports=['clustr_mm'], allow_failed_imports=False)
custom_hooks = [dict(type='SyncBuffersHook'), dict(type='RandomStateHook'),
                dict(type='FailFastHook')]

model = dict(
    # fine-tuned from an ImageNet classifier's weights (a config names the
    # backbone and its imagenet_checkpoint)
    backbone=dict(
        _delete_=True,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', prefix='backbone.')),
    neck=dict(
        type='MultiStageAggregation',
        out_channels=256,
        num_heads=4,
        mlp_ratio=4,
        pool_ratios=(8, 4, 2)),
    # the base's HeatmapHead: no deconvolutions, a 1x1 final conv
    head=dict(in_channels=256, deconv_out_channels=None))

optim_wrapper = dict(
    optimizer=dict(
        _delete_=True, type='AdamW', lr=5e-4, betas=(0.9, 0.999),
        weight_decay=0.01))
max_epochs = 210
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='LinearLR', begin=0, end=500, start_factor=0.001,
         by_epoch=False),
    dict(type='MultiStepLR', begin=0, end=max_epochs, milestones=[170, 200],
         gamma=0.1, by_epoch=True),
]
auto_scale_lr = dict(base_batch_size=512)  # 8 GPUs x 64 images

# ClusTR-S whole-body pose as the paper trained it (ClusTR Table 5: 59.4 AP /
# 69.7 AR on COCO-WholeBody v1.0 val), "the same settings as TCFormer":
# - all four backbone stages feed MultiStageAggregation (TCFormer's MTA neck
#   on grids: 1x1 laterals to 256 channels, top-down nearest up-sampling and
#   addition, one pooled-key/value transformer block after each merge at
#   strides 16, 8 and 4); the head is one 1x1 conv to 133 heatmaps at stride
#   4 (no deconvolutions);
# - AdamW lr 5e-4, betas (0.9, 0.999), weight decay 0.01; linear warm-up over
#   500 iterations from 0.001 x lr, x0.1 at epochs 170 and 200, 210 epochs,
#   8 GPUs x 64 images; MSRAHeatmap sigma 2 (64x48 heatmaps); flip test with
#   the heatmap shifted by one pixel, standard decoding (no DARK); person
#   boxes of COCO_val2017_detections_AP_H_56_person.json.
# Data pipeline, test settings and metric: mmpose's HRNet whole-body config,
# mmpose 1.x's port of this recipe (one known difference from TCFormer's
# mmpose 0.x code: 1.x draws rotations as a normal truncated to +-1 times 80
# degrees, 0.x as a 40-degree normal clipped at +-80).
# No drop path (TCFormer's config has none). The simpler model, last stage +
# three deconvolutions: td-hm_clustr-s_8xb64-210e_coco-wholebody-256x192.py.
_base_ = [
    'mmpose::wholebody_2d_keypoint/topdown_heatmap/coco-wholebody/'
    'td-hm_hrnet-w32_8xb64-210e_coco-wholebody-256x192.py'
]
custom_imports = dict(imports=['clustr_mm'], allow_failed_imports=False)
# mmpose's SyncBuffersHook, then: resume continues the random streams; a
# non-finite loss stops the run before it is saved (clustr_mm/engine).
custom_hooks = [dict(type='SyncBuffersHook'), dict(type='RandomStateHook'),
                dict(type='FailFastHook')]

imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='ClusTR',
        arch='small',
        clustering_mode='window',
        drop_path_rate=0.0,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(
            type='Pretrained', checkpoint=imagenet_checkpoint,
            prefix='backbone.')),
    neck=dict(
        type='MultiStageAggregation',
        in_channels=[64, 128, 256, 512],
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

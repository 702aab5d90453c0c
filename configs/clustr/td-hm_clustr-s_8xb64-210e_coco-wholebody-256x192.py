# The simple alternative, NOT the paper's model: top-down heatmap whole-body
# pose (133 keypoints) on COCO-WholeBody with ClusTR-S, where only the
# stride-32 features reach the stride-4 64x48 heatmaps, through three 2x
# deconvolutions in the head (the SimpleBaseline design). AdamW lr 5e-4,
# wd 0.01, 210 epochs, batch 512 = 8 GPUs x 64. The paper's setting (all
# four stages through TCFormer's neck, a 1x1 head):
# td-hm_clustr-s_mta-8xb64-210e_coco-wholebody-256x192.py.
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
        drop_path_rate=0.1,
        out_indices=(3, ),
        init_cfg=dict(
            type='Pretrained', checkpoint=imagenet_checkpoint,
            prefix='backbone.')),
    head=dict(
        in_channels=512,
        deconv_out_channels=(256, 256, 256),
        deconv_kernel_sizes=(4, 4, 4)))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=5e-4, weight_decay=0.01))

# Top-down heatmap whole-body pose (133 keypoints) on COCO-WholeBody, the
# simple design both families share: mmpose's HRNet-W32 config (210 epochs,
# batch 512 = 8 GPUs x 64, 256x192 inputs, 64x48 heatmaps) with only the
# stride-32 features reaching the heatmaps through three 2x deconvolutions
# in the head (SimpleBaseline), AdamW lr 5e-4, wd 0.01. A config replaces
# the backbone (with _delete_, out_indices (3, )) and sets the head's
# in_channels and its ImageNet checkpoint.
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
        out_indices=(3, ),
        init_cfg=dict(type='Pretrained', prefix='backbone.')),
    head=dict(
        deconv_out_channels=(256, 256, 256),
        deconv_kernel_sizes=(4, 4, 4)))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=5e-4, weight_decay=0.01))

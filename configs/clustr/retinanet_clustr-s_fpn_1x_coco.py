# RetinaNet 1x on COCO with ClusTR-S (paper recipe: AdamW lr 1e-4, wd 1e-4,
# batch 16 = 8 GPUs x 2, 12 epochs).
_base_ = ['mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py']
# The Swin base's ImageNet URL; the backbone is replaced, so it must not show.
pretrained = None
custom_imports = dict(imports=['clustr_mm'], allow_failed_imports=False)
# Resume continues the random streams; a non-finite loss stops the run before
# it is saved (clustr_mm/engine).
custom_hooks = [dict(type='RandomStateHook'), dict(type='FailFastHook')]

imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'

model = dict(
    # short of GPU memory: add with_cp=True (each block recomputed in the
    # backward pass; figures in docs/benchmarks.md)
    backbone=dict(
        _delete_=True,
        type='ClusTR',
        arch='small',
        clustering_mode='window',
        drop_path_rate=0.1,
        out_indices=(1, 2, 3),
        init_cfg=dict(
            type='Pretrained', checkpoint=imagenet_checkpoint,
            prefix='backbone.')),
    neck=dict(in_channels=[128, 256, 512], start_level=0, num_outs=5))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                   weight_decay=1e-4))

# RetinaNet 1x on COCO, what both families share: mmdet's Swin-T config (FPN
# from the stride-8 map, 12 epochs, batch 16 = 8 GPUs x 2) with the ClusTR
# paper's optimizer (AdamW lr 1e-4, wd 1e-4) and clustr_mm's runtime. A
# config replaces the backbone (with _delete_, out_indices (1, 2, 3)) and
# sets the neck's in_channels and its ImageNet checkpoint.
_base_ = [
    'mmdet::swin/retinanet_swin-t-p4-w7_fpn_1x_coco.py',
    './default_runtime.py',
]
# The Swin base's ImageNet URL; the backbone is replaced, so it must not show.
pretrained = None
# every backbone here is fine-tuned from an ImageNet classifier's weights
# (a config names the backbone and its imagenet_checkpoint)
model = dict(
    backbone=dict(
        _delete_=True,
        out_indices=(1, 2, 3),
        init_cfg=dict(type='Pretrained', prefix='backbone.')))
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999),
                   weight_decay=1e-4))

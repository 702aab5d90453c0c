# Mask R-CNN 1x on COCO, what both families share: mmdet's Swin-T config
# (FPN, AdamW, 12 epochs, batch 16 = 8 GPUs x 2) with clustr_mm's runtime. A
# config replaces the backbone (with _delete_) and sets the neck's
# in_channels, its optimizer and its ImageNet checkpoint.
_base_ = [
    'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py',
    './default_runtime.py',
]
# The Swin base's ImageNet URL; the backbone is replaced, so it must not show.
pretrained = None
# every backbone here is fine-tuned from an ImageNet classifier's weights
# (a config names the backbone and its imagenet_checkpoint)
model = dict(
    backbone=dict(
        _delete_=True,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', prefix='backbone.')))

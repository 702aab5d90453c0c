# Mask R-CNN 1x on COCO with PaCa-ViT-B: the release's
# mask_rcnn_pacavit_base_p2cconv_100_0_mstrain_480_800_1x_coco recipe (that of
# PaCa-S, drop path 0.1 as in the release). Differs from the release: nothing.
_base_ = './mask-rcnn_paca-s_fpn_ms-1x_coco.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_base_p2cconv_100_0.pth')
model = dict(
    # short of GPU memory: add with_cp=True (each block recomputed in the
    # backward pass; figures in docs/benchmarks.md)
    backbone=dict(arch='base', init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[96, 192, 384, 512]))

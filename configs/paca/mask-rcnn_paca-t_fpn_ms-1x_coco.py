# Mask R-CNN 1x on COCO with PaCa-ViT-T: the release's
# mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco recipe (that of
# PaCa-S). Differs from the release: nothing.
_base_ = './mask-rcnn_paca-s_fpn_ms-1x_coco.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_tiny_p2cconv_100_0.pth')
model = dict(
    # short of GPU memory: add with_cp=True (each block recomputed in the
    # backward pass; figures in docs/benchmarks.md)
    backbone=dict(arch='tiny', init_cfg=dict(checkpoint=imagenet_checkpoint)))

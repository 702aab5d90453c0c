# PaCa-ViT paper ablation on COCO: Mask R-CNN 1x with PaCa-S,
# num_clusters=(49, 49, 49, 0), the release's
# mask_rcnn_pacavit_small_p2cconv_49_0_mstrain_480_800_1x_coco recipe (that of
# PaCa-S), from the release's IMNET_224_pacavit_small_p2cconv_49_0.pth.
# Differs from the release: nothing.
_base_ = '../paca/mask-rcnn_paca-s_fpn_ms-1x_coco.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_small_p2cconv_49_0.pth')
model = dict(
    backbone=dict(num_clusters=(49, 49, 49, 0),
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))

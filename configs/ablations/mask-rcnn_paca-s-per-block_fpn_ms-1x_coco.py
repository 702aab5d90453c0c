# PaCa-ViT paper ablation on COCO: Mask R-CNN 1x with PaCa-S,
# num_clusters=(100, 100, 100, 100), clustering_interval=1, the release's
# mask_rcnn_pacavit_small_p2cconv_100_blockwise_mstrain_480_800_1x_coco recipe
# (that of PaCa-S), from the release's
# IMNET_224_pacavit_small_p2cconv_100_blockwise.pth. Differs from the release:
# nothing.
_base_ = '../paca/mask-rcnn_paca-s_fpn_ms-1x_coco.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_small_p2cconv_100_blockwise.pth')
model = dict(
    backbone=dict(num_clusters=(100, 100, 100, 100),
                  clustering_interval=1,
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))

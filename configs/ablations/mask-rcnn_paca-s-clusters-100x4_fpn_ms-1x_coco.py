# PaCa-ViT paper ablation on COCO: Mask R-CNN 1x with PaCa-S,
# num_clusters=(100, 100, 100, 100), the release's
# mask_rcnn_pacavit_small_p2cconv_100_mstrain_480_800_1x_coco recipe (that of
# PaCa-S), from the ImageNet weights paca-s-clusters-100x4_8xb128_in1k.py
# makes (the release's file for this row is not published: the official README
# links the 100-81-64-49 classifier there). Differs from the release: nothing.
_base_ = '../paca/mask-rcnn_paca-s_fpn_ms-1x_coco.py'
imagenet_checkpoint = 'work_dirs/paca-s-clusters-100x4_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(num_clusters=(100, 100, 100, 100),
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))

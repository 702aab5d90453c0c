# Mask R-CNN 1x on COCO with PaCa-ViT-B-teacher: the release's
# mask_rcnn_pacavit_convmixer_base_100_mstrain_480_800_1x_coco recipe (that of
# PaCa-S, drop path 0.1) from its IMNET_224_pacavit_convmixer_base_100.pth.
# Differs from the release: nothing.
_base_ = './mask-rcnn_paca-b_fpn_ms-1x_coco.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_convmixer_base_100.pth')
model = dict(
    backbone=dict(clustering='teacher',
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))
# The release's 'norm' group does not reach the teacher's BatchNorms (its
# modules are numbered, ours named norm*): keep their weight decay.
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'teacher': dict(decay_mult=1.)}))

# Mask R-CNN 1x on COCO with PaCa-ViT-S-teacher (ConvMixer external clustering,
# 100 clusters in all stages), the release's recipe (that of PaCa-S) from the
# release's IMNET_224_pacavit_convmixer_small_100.pth. The release's detector
# for this row is not published: the official README's small-teacher row links
# the tiny-teacher file (mask-rcnn_paca-t-teacher_fpn_ms-1x_coco.py). Differs
# from the release: nothing in the recipe.
_base_ = './mask-rcnn_paca-s_fpn_ms-1x_coco.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_convmixer_small_100.pth')
model = dict(
    backbone=dict(clustering='teacher',
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))
# The release's 'norm' group does not reach the teacher's BatchNorms (its
# modules are numbered, ours named norm*): keep their weight decay.
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'teacher': dict(decay_mult=1.)}))

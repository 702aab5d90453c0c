# Mask R-CNN 1x on COCO with PaCa-ViT-T-teacher: the release's
# mask_rcnn_pacavit_convmixer_tiny_100_mstrain_480_800_1x_coco recipe (that of
# PaCa-S). The release publishes no tiny-teacher ImageNet file, so this config
# starts from the one paca-t-teacher_8xb128_in1k.py makes (train it first, or
# point imagenet_checkpoint elsewhere). Differs from the release: nothing in
# the recipe.
_base_ = './mask-rcnn_paca-t_fpn_ms-1x_coco.py'
imagenet_checkpoint = 'work_dirs/paca-t-teacher_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(clustering='teacher',
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))
# The release's 'norm' group does not reach the teacher's BatchNorms (its
# modules are numbered, ours named norm*): keep their weight decay.
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'teacher': dict(decay_mult=1.)}))

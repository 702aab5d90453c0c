_base_ = './mask-rcnn_paca-s_fpn_ms-1x_coco.py'
imagenet_checkpoint = 'work_dirs/paca-t_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(arch='tiny', init_cfg=dict(checkpoint=imagenet_checkpoint)))

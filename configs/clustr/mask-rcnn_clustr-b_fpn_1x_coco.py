_base_ = './mask-rcnn_clustr-t_fpn_1x_coco.py'
imagenet_checkpoint = 'work_dirs/clustr-b_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(
        arch='base',
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[64, 128, 320, 512]))

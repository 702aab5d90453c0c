_base_ = './mask-rcnn_paca-s_fpn_ms-1x_coco.py'
imagenet_checkpoint = 'work_dirs/paca-b_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.2,
                  init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[96, 192, 384, 512]))

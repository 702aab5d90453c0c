_base_ = './mask-rcnn_clustr-t_fpn_1x_coco.py'
imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(
        arch='small',
        init_cfg=dict(checkpoint=imagenet_checkpoint)))

_base_ = './mask-rcnn_clustr-t_fpn_1x_coco.py'
imagenet_checkpoint = 'work_dirs/clustr-b_8xb128_in1k/epoch_300.pth'
model = dict(
    # short of GPU memory: add with_cp=True (each block recomputed in the
    # backward pass; figures in docs/benchmarks.md)
    backbone=dict(
        arch='base',
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[64, 128, 320, 512]))

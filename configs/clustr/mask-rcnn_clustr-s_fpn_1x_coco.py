_base_ = './mask-rcnn_clustr-t_fpn_1x_coco.py'
imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'
model = dict(
    # short of GPU memory: add with_cp=True (each block recomputed in the
    # backward pass; figures in docs/benchmarks.md)
    backbone=dict(
        arch='small',
        init_cfg=dict(checkpoint=imagenet_checkpoint)))

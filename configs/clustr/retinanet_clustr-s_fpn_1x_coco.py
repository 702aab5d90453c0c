# RetinaNet 1x on COCO with ClusTR-S (paper recipe: AdamW lr 1e-4, wd 1e-4,
# batch 16 = 8 GPUs x 2, 12 epochs).
_base_ = '../_base_/retinanet_fpn_1x_coco.py'

imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'

model = dict(
    # short of GPU memory: add with_cp=True (each block recomputed in the
    # backward pass; figures in docs/benchmarks.md)
    backbone=dict(
        type='ClusTR',
        arch='small',
        clustering_mode='window',
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[128, 256, 512], start_level=0, num_outs=5))


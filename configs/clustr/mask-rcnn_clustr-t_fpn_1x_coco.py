# Mask R-CNN 1x on COCO with a ClusTR-T backbone, fine-tuned from ImageNet.
# Recipe of the paper: AdamW lr 2e-4, wd 1e-4, batch 16 (8 GPUs x 2), 12 epochs.
_base_ = '../_base_/mask-rcnn_fpn_1x_coco.py'

# ImageNet checkpoint to fine-tune from: the output of
# `tools/train.py configs/clustr/clustr-t_8xb128_in1k.py`, or an official
# checkpoint converted with tools/model_converters/clustr_official_to_mm.py.
imagenet_checkpoint = 'work_dirs/clustr-t_8xb128_in1k/epoch_300.pth'

model = dict(
    # short of GPU memory: add with_cp=True (each block recomputed in the
    # backward pass; figures in docs/benchmarks.md)
    backbone=dict(
        type='ClusTR',
        arch='tiny',
        # Windowed DPC-kNN: never builds an N x N matrix at detection sizes.
        clustering_mode='window',
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[64, 128, 256, 512]))

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, betas=(0.9, 0.999),
                   weight_decay=1e-4))

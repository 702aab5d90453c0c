# Semantic FPN 80k on ADE20K with ClusTR-S (paper recipe: AdamW lr 1e-4, wd 1e-4,
# poly 0.9 decaying to 0, batch 16 = 8 GPUs x 2: ../_base_/fpn_8xb2-80k_ade20k-512x512.py).
_base_ = '../_base_/fpn_8xb2-80k_ade20k-512x512.py'

imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(
        type='ClusTR',
        arch='small',
        clustering_mode='window',
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[64, 128, 256, 512]))

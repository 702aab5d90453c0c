# UperNet 160k on ADE20K with ClusTR-S (paper recipe: AdamW lr 6e-5, wd 0.01,
# 1500 linear warm-up iterations, then poly 1.0 to 0; batch 16 = 8 GPUs x 2).
_base_ = '../_base_/upernet_8xb2-160k_ade20k-512x512.py'

imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(
        type='ClusTR',
        arch='small',
        clustering_mode='window',
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    decode_head=dict(in_channels=[64, 128, 256, 512]),
    auxiliary_head=dict(in_channels=256))

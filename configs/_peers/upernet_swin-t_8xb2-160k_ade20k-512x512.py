# Speed peer, not a model of the zoo: ClusTR-S's UperNet 160k ADE20K recipe
# (../clustr/upernet_clustr-s_8xb2-160k_ade20k-512x512.py: the same base
# piece, heads, crops, batch and schedule) with mmdet's Swin-T as backbone,
# from random weights. For tools/analysis/train_speed.py beside the ClusTR-S
# config (tools/run_gpu_checks.sh step 54); not trained, no metafile entry.
_base_ = '../_base_/upernet_8xb2-160k_ade20k-512x512.py'

model = dict(
    backbone=dict(
        type='mmdet.SwinTransformer',  # as benchmark.py's swin-t
        embed_dims=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=7,
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.1,  # ClusTR-S's, not mmseg's Swin recipe's 0.3
        init_cfg=None),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))

# Speed peer, not a model of the zoo: ClusTR-S's UperNet 160k ADE20K recipe
# (../clustr/upernet_clustr-s_8xb2-160k_ade20k-512x512.py: the same base
# piece, heads, crops, batch and schedule) with mmdet's PVTv2-b2 as
# backbone, from random weights (mmseg ships no PVT config). For
# tools/analysis/train_speed.py beside the ClusTR-S config
# (tools/run_gpu_checks.sh step 54); not trained, no metafile entry.
_base_ = '../_base_/upernet_8xb2-160k_ade20k-512x512.py'

model = dict(
    backbone=dict(
        type='mmdet.PyramidVisionTransformerV2',  # as benchmark.py's pvtv2-b2
        embed_dims=64,
        num_layers=[3, 4, 6, 3],
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.1,  # ClusTR-S's
        init_cfg=None),
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))

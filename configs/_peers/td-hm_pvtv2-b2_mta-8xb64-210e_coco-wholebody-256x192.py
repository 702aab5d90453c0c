# Speed peer, not a model of the zoo: ClusTR-S's whole-body pose model as the
# paper trained it (../clustr/td-hm_clustr-s_mta-8xb64-210e_coco-wholebody-
# 256x192.py: all four stages through MultiStageAggregation, a 1x1 head,
# 256x192 crops, batch 64 per GPU) with mmdet's PVTv2-b2 as backbone, from
# random weights. For tools/analysis/train_speed.py beside the ClusTR-S
# config (tools/run_gpu_checks.sh step 54); not trained, no metafile entry.
_base_ = '../_base_/td-hm_mta-8xb64-210e_coco-wholebody-256x192.py'

model = dict(
    backbone=dict(
        type='mmdet.PyramidVisionTransformerV2',  # as benchmark.py's pvtv2-b2
        embed_dims=64,
        num_layers=[3, 4, 6, 3],
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.0,  # ClusTR-S's in this model
        init_cfg=None),
    neck=dict(in_channels=[64, 128, 320, 512]))

# Speed peer, not a model of the zoo: ClusTR-S's whole-body pose model as the
# paper trained it (../clustr/td-hm_clustr-s_mta-8xb64-210e_coco-wholebody-
# 256x192.py: all four stages through MultiStageAggregation, a 1x1 head,
# 256x192 crops, batch 64 per GPU) with mmdet's Swin-T as backbone, from
# random weights. For tools/analysis/train_speed.py beside the ClusTR-S
# config (tools/run_gpu_checks.sh step 54); not trained, no metafile entry.
_base_ = '../_base_/td-hm_mta-8xb64-210e_coco-wholebody-256x192.py'

model = dict(
    backbone=dict(
        type='mmdet.SwinTransformer',  # as benchmark.py's swin-t
        embed_dims=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=7,
        out_indices=(0, 1, 2, 3),
        drop_path_rate=0.0,  # ClusTR-S's in this model
        init_cfg=None),
    neck=dict(in_channels=[96, 192, 384, 768]))

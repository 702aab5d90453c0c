# The simple alternative, NOT the paper's model: top-down heatmap whole-body
# pose (133 keypoints) on COCO-WholeBody with ClusTR-S, where only the
# stride-32 features reach the stride-4 64x48 heatmaps, through three 2x
# deconvolutions in the head (the SimpleBaseline design). AdamW lr 5e-4,
# wd 0.01, 210 epochs, batch 512 = 8 GPUs x 64. The paper's setting (all
# four stages through TCFormer's neck, a 1x1 head):
# td-hm_clustr-s_mta-8xb64-210e_coco-wholebody-256x192.py.
_base_ = '../_base_/td-hm_8xb64-210e_coco-wholebody-256x192.py'

imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'

model = dict(
    backbone=dict(
        type='ClusTR',
        arch='small',
        clustering_mode='window',
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    head=dict(in_channels=512))

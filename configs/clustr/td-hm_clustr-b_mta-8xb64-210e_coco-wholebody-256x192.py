# ClusTR-B in the paper's whole-body pose setting (neck, 1x1 head, TCFormer's
# recipe): see td-hm_clustr-s_mta-8xb64-210e_coco-wholebody-256x192.py. The
# paper reports ClusTR-S only.
_base_ = './td-hm_clustr-s_mta-8xb64-210e_coco-wholebody-256x192.py'

imagenet_checkpoint = 'work_dirs/clustr-b_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(
        arch='base',
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[64, 128, 320, 512]))

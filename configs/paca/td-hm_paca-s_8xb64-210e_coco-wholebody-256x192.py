# Whole-body top-down pose with PaCa-ViT-S, same recipe and deconv head as the
# ClusTR-S config (AdamW lr 5e-4, wd 0.01, 210 epochs, batch 512).
_base_ = '../clustr/td-hm_clustr-s_8xb64-210e_coco-wholebody-256x192.py'

imagenet_checkpoint = 'work_dirs/paca-s_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='PaCaViT',
        arch='small',
        clustering='conv',
        drop_path_rate=0.1,
        out_indices=(3, ),
        init_cfg=dict(
            type='Pretrained', checkpoint=imagenet_checkpoint,
            prefix='backbone.')),
    head=dict(in_channels=384))

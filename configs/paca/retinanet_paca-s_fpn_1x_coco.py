# RetinaNet 1x on COCO with PaCa-ViT-S (AdamW lr 1e-4, wd 1e-4, batch 16).
_base_ = '../clustr/retinanet_clustr-s_fpn_1x_coco.py'

imagenet_checkpoint = 'work_dirs/paca-s_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='PaCaViT',
        arch='small',
        clustering='conv',
        drop_path_rate=0.1,
        out_indices=(1, 2, 3),
        init_cfg=dict(
            type='Pretrained', checkpoint=imagenet_checkpoint,
            prefix='backbone.')),
    neck=dict(in_channels=[192, 320, 384]))

# UperNet 160k on ADE20K with PaCa-ViT-S, the official recipe (AdamW lr 6e-5,
# wd 0.01, 1500 warm-up iterations, poly 1.0) with 200 clusters per stage; the
# ImageNet checkpoint's 100-cluster layers are re-initialised with a warning.
_base_ = '../clustr/upernet_clustr-s_8xb2-160k_ade20k-512x512.py'

imagenet_checkpoint = 'work_dirs/paca-s_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(
        _delete_=True,
        type='PaCaViT',
        arch='small',
        clustering='conv',
        num_clusters=(200, 200, 200, 0),
        drop_path_rate=0.1,
        init_cfg=dict(
            type='Pretrained', checkpoint=imagenet_checkpoint,
            prefix='backbone.')),
    decode_head=dict(in_channels=[96, 192, 320, 384]),
    auxiliary_head=dict(in_channels=320))

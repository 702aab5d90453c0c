_base_ = './upernet_paca-s_8xb2-160k_ade20k-512x512.py'
imagenet_checkpoint = 'work_dirs/paca-b_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.3,
                  init_cfg=dict(checkpoint=imagenet_checkpoint)),
    decode_head=dict(in_channels=[96, 192, 384, 512]),
    auxiliary_head=dict(in_channels=384))

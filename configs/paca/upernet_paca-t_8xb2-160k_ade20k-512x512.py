_base_ = './upernet_paca-s_8xb2-160k_ade20k-512x512.py'
imagenet_checkpoint = 'work_dirs/paca-t_8xb128_in1k/epoch_300.pth'
model = dict(
    backbone=dict(arch='tiny', init_cfg=dict(checkpoint=imagenet_checkpoint)))

# UperNet + PaCa-ViT-T (200 clusters per stage) on the tiny embedded ADE20K:
# 128x128 crops and a short schedule so it trains in minutes on a CPU.
_base_ = '../_base_/upernet_embedded-ade20k.py'

model = dict(
    backbone=dict(
        type='PaCaViT',
        arch='tiny',
        clustering='conv',
        num_clusters=(200, 200, 200, 0)),
    decode_head=dict(in_channels=[96, 192, 320, 384]),
    auxiliary_head=dict(in_channels=320))
# the release's: no weight decay on norms
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))

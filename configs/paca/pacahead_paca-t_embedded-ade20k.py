# PaCa segmentation head + PaCa-ViT-T (200 clusters per stage) on the tiny
# embedded ADE20K: 128x128 crops and a short schedule so it trains in minutes
# on a CPU, from random weights, with a 10-iteration linear warm-up (without
# it one seed in three ended predicting one class everywhere, ~7-10
# mIoU; with it seeds 0-5 all end at ~26: configs/paca/README.md). The tests
# run it with --cfg-options randomness.seed=0.
_base_ = './upernet_paca-t_embedded-ade20k.py'

norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    decode_head=dict(
        _delete_=True,
        type='PaCaSegHead',
        in_channels=[96, 192, 320, 384],
        in_index=[0, 1, 2, 3],
        channels=256,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                         avg_non_ignore=True, loss_weight=1.0),
        aux_loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                             avg_non_ignore=True, loss_weight=0.4)),
    auxiliary_head=None)
# the release's groups (pacahead_paca-s), their x10 off on this short run
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'head': dict(lr_mult=1.),
        'clustering.to_clusters': dict(lr_mult=1.),
    }))
warmup_iters = 10
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0,
         end=warmup_iters),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=warmup_iters,
         end=40, by_epoch=False)
]

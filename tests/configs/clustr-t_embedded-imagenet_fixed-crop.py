# ClusTR-T embedded ImageNet without random augmentation (resize + centre
# crop for training too) and with every rank's losses recorded: a 1-process
# run and a 2-process run with the same global batch are then comparable.
_base_ = '../../configs/clustr/clustr-t_embedded-imagenet.py'

custom_imports = dict(imports=['clustr_mm', 'rank_loss_hook'],
                      allow_failed_imports=False)
train_dataloader = dict(dataset=dict(pipeline=[
    dict(type='LoadImageFromFile'),
    dict(type='ResizeEdge', scale=64, edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=64),
    dict(type='PackInputs'),
]))
custom_hooks = [dict(type='RankLossHook')]
randomness = dict(seed=0)

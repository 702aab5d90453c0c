# ClusTR-T on ImageNet-1K: the paper's 300-epoch recipe
# (../_base_/imagenet_8xb128-300e.py) with the official training script's
# repeated augmentation (3 repeats, DeiT's RASampler: RepeatAugSampler).
# The official launcher trains with --amp (fp16 autocast, gradient scaler):
# `tools/train.py CONFIG --amp`.
_base_ = '../_base_/imagenet_8xb128-300e.py'

model = dict(
    backbone=dict(
        type='ClusTR', arch='tiny', clustering_mode='exact',
        drop_path_rate=0.1),
    head=dict(in_channels=512))
train_dataloader = dict(sampler=dict(type='RepeatAugSampler', shuffle=True))

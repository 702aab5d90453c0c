# PaCa-ViT-S (conv clustering) on ImageNet-1K, trained from scratch: the same
# 300-epoch DeiT-style recipe as ClusTR (AdamW lr 1e-3 at batch 1024 = 8 GPUs x
# 128, wd 0.05, cosine, 5 warm-up epochs, RandAugment, Mixup/CutMix, random
# erasing, label smoothing; timm's per-epoch warm-up + cosine curve), drop path
# 0.1, no repeated augmentation (the base's sampler). Evaluation is the release's (timm's
# crop_pct 0.9: short side to 248, bicubic, centre crop 224, PIL decoding), so
# `tools/test.py` on IMNET_224_pacavit_small_p2cconv_100_0.pth measures its
# published top-1. Differs from the release: training augmentation is
# mmpretrain's Swin/DeiT one, not the release's timm script.
_base_ = '../_base_/imagenet_8xb128-300e.py'

model = dict(
    backbone=dict(
        type='PaCaViT', arch='small', clustering='conv', drop_path_rate=0.1),
    head=dict(in_channels=384))

# The release's evaluation transform (timm: resize to floor(224 / 0.9) = 248).
test_pipeline = [
    dict(type='LoadImageFromFile', imdecode_backend='pillow'),
    dict(type='ResizeEdge', scale=248, edge='short', backend='pillow',
         interpolation='bicubic'),
    dict(type='CenterCrop', crop_size=224),
    dict(type='PackInputs'),
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

# PaCa-ViT-S (conv clustering) on ImageNet-1K: the same 300-epoch DeiT-style
# recipe as ClusTR (AdamW lr 1e-3 at batch 1024 = 8 GPUs x 128, wd 0.05, cosine,
# 5 warm-up epochs, RandAugment, Mixup/CutMix, random erasing, label smoothing),
# drop path 0.1.
_base_ = '../clustr/clustr-t_8xb128_in1k.py'

model = dict(
    backbone=dict(
        _delete_=True, type='PaCaViT', arch='small', clustering='conv',
        drop_path_rate=0.1),
    head=dict(in_channels=384))

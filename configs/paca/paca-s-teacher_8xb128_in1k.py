# PaCa-ViT-S with external clustering: a small ConvMixer teacher with its own
# FPN assigns clusters for every student block (100 clusters in all 4 stages).
# Recipe and evaluation of paca-s_8xb128_in1k.py (its first comment says what
# differs from the release); the release's classifier:
# IMNET_224_pacavit_convmixer_small_100.pth.
_base_ = './paca-s_8xb128_in1k.py'
model = dict(backbone=dict(clustering='teacher'))

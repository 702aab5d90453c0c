# PaCa-ViT-S with external clustering: a small ConvMixer teacher with its own
# FPN assigns clusters for every student block (100 clusters in all 4 stages).
_base_ = './paca-s_8xb128_in1k.py'
model = dict(backbone=dict(clustering='teacher'))

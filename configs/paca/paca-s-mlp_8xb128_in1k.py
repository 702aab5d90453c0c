# PaCa-ViT-S with the MLP clustering module (Linear C->4C, GELU, Linear 4C->M).
_base_ = './paca-s_8xb128_in1k.py'
model = dict(backbone=dict(clustering='mlp'))

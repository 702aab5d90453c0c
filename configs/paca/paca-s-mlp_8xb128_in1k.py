# PaCa-ViT-S with the MLP clustering module (Linear C->4C, GELU, Linear 4C->M).
# Recipe and evaluation of paca-s_8xb128_in1k.py (its first comment says what
# differs from the release); the release's classifier:
# IMNET_224_pacavit_small_p2cmlp_100_0.pth.
_base_ = './paca-s_8xb128_in1k.py'
model = dict(backbone=dict(clustering='mlp'))

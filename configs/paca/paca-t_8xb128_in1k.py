# PaCa-ViT-T on ImageNet-1K, trained from scratch. Recipe and evaluation of
# paca-s_8xb128_in1k.py (its first comment says what differs from the release);
# the release's classifier: IMNET_224_pacavit_tiny_p2cconv_100_0.pth.
_base_ = './paca-s_8xb128_in1k.py'
model = dict(backbone=dict(arch='tiny'))

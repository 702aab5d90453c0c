# PaCa-ViT-T classification on the tiny embedded ImageNet: the data and short
# schedule of ../_base_/imagenet_embedded.py with a PaCa backbone.
_base_ = '../_base_/imagenet_embedded.py'

model = dict(
    backbone=dict(type='PaCaViT', arch='tiny', clustering='conv'),
    head=dict(in_channels=384))

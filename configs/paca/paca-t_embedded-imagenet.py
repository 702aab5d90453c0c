# PaCa-ViT-T classification on the tiny embedded ImageNet: the data and short
# schedule of the ClusTR-T embedded config with a PaCa backbone.
_base_ = '../clustr/clustr-t_embedded-imagenet.py'

model = dict(
    backbone=dict(_delete_=True, type='PaCaViT', arch='tiny',
                  clustering='conv'),
    head=dict(in_channels=384))

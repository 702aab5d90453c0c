# ClusTR-T classification on the tiny embedded ImageNet (4 classes, 64x64
# crops): ../_base_/imagenet_embedded.py's data and short schedule.
_base_ = '../_base_/imagenet_embedded.py'

model = dict(
    backbone=dict(
        type='ClusTR', arch='tiny', clustering_mode='exact',
        drop_path_rate=0.0),
    head=dict(in_channels=512))

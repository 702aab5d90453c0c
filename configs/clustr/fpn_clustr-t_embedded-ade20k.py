# Semantic FPN + ClusTR-T on the tiny embedded ADE20K: 128x128 crops and a
# short schedule so it trains and evaluates in minutes on a CPU.
_base_ = '../_base_/fpn_embedded-ade20k.py'

model = dict(
    backbone=dict(
        type='ClusTR',
        arch='tiny',
        clustering_mode='window'),
    neck=dict(in_channels=[64, 128, 256, 512]))

_base_ = './paca-s_8xb128_in1k.py'
model = dict(backbone=dict(arch='tiny'))

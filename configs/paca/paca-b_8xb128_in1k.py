# PaCa-ViT-B: drop path 0.5.
_base_ = './paca-s_8xb128_in1k.py'
model = dict(backbone=dict(arch='base', drop_path_rate=0.5),
             head=dict(in_channels=512))

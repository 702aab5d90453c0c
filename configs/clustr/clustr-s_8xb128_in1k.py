_base_ = './clustr-t_8xb128_in1k.py'
model = dict(backbone=dict(arch='small', drop_path_rate=0.1))

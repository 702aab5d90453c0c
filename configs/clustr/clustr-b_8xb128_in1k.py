# ClusTR-B: drop path 0.3 and gradient clipping at norm 1.0, as in the paper.
_base_ = './clustr-t_8xb128_in1k.py'
model = dict(backbone=dict(arch='base', drop_path_rate=0.3))
optim_wrapper = dict(clip_grad=dict(max_norm=1.0))

# PaCa-ViT-B: drop path 0.5 and gradient clipping at norm 1.0 (the official
# model definition's note beside its drop path; the published yml leaves
# clipping to the command line). Recipe and evaluation of paca-s_8xb128_in1k.py
# (its first comment says what differs from the release); the release's
# classifier: IMNET_224_pacavit_base_p2cconv_100_0.pth.
_base_ = './paca-s_8xb128_in1k.py'
model = dict(backbone=dict(arch='base', drop_path_rate=0.5),
             head=dict(in_channels=512))
optim_wrapper = dict(clip_grad=dict(max_norm=1.0))

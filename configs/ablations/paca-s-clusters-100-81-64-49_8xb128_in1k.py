# PaCa-ViT paper ablation: PaCa-S (conv clustering) with (100, 81, 64, 49)
# clusters per stage (0: full self-attention in that stage). Recipe and
# evaluation of paca-s_8xb128_in1k.py (its first comment says what differs from
# the release); the release's classifier:
# IMNET_224_pacavit_small_p2cconv_100_49.pth.
_base_ = '../paca/paca-s_8xb128_in1k.py'

model = dict(backbone=dict(num_clusters=(100, 81, 64, 49)))

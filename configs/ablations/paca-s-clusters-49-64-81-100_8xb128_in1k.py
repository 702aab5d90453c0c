# PaCa-ViT paper ablation: PaCa-S (conv clustering) with (49, 64, 81, 100)
# clusters per stage (0: full self-attention in that stage). Recipe and
# evaluation of paca-s_8xb128_in1k.py (its first comment says what differs from
# the release); the release's classifier:
# IMNET_224_pacavit_small_p2cconv_49_100.pth.
_base_ = '../paca/paca-s_8xb128_in1k.py'

model = dict(backbone=dict(num_clusters=(49, 64, 81, 100)))

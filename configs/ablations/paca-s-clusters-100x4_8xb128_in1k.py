# PaCa-ViT paper ablation: PaCa-S (conv clustering) with (100, 100, 100, 100)
# clusters per stage (0: full self-attention in that stage). Recipe and
# evaluation of paca-s_8xb128_in1k.py (its first comment says what differs from
# the release); the release has no file for this setting (its README links the
# 100-81-64-49 classifier here).
_base_ = '../paca/paca-s_8xb128_in1k.py'

model = dict(backbone=dict(num_clusters=(100, 100, 100, 100)))

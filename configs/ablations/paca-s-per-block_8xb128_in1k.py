# PaCa-ViT paper ablation: PaCa-S with a clustering network in every block
# (instead of one per stage whose assignment the later blocks reuse), 100
# clusters in all four stages as in the release's block-wise model
# (IMNET_224_pacavit_small_p2cconv_100_blockwise.pth). Recipe and evaluation of
# paca-s_8xb128_in1k.py (its first comment says what differs from the release).
_base_ = '../paca/paca-s_8xb128_in1k.py'

model = dict(backbone=dict(num_clusters=(100, 100, 100, 100),
                           clustering_interval=1))

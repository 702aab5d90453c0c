# PaCa-ViT paper ablation: PaCa-S with a clustering network in every block
# (instead of one per stage whose assignment the later blocks reuse).
_base_ = '../paca/paca-s_8xb128_in1k.py'

model = dict(backbone=dict(clustering_interval=1))

# ClusTR paper ablation: the multi-scale reference point, ClusTR-T itself,
# with its reducer spelled out: DPC-kNN at two nested scales (N/sr^2 and
# 4N/sr^2 clusters, sr = 8, 4, 2), one kv projection per scale, outputs
# summed; full attention in stage 4. Published: 11.7 M params, 77.9 Top-1
# (100 epochs), 42.6 mIoU.
_base_ = '../clustr/clustr-t_8xb128_in1k.py'

model = dict(
    backbone=dict(reducers=dict(type='DPCKNN', scale_factors=(1, 4))))
train_cfg = dict(max_epochs=100)

# ClusTR paper ablation: single-scale clustering, token reduction ratios
# {64, 16, 4, 1} per stage (N/64, N/16, N/4 clusters: sr = 8, 4, 2; full
# attention in stage 4). One kv projection per stage. Published: 10.8 M
# params, 77.2 Top-1 (100 epochs), 41.2 mIoU.
_base_ = './clustr-t-multi-scale_8xb128_in1k.py'

model = dict(backbone=dict(reducers=dict(scale_factors=(1, ))))

# ClusTR paper ablation: single-scale clustering, token reduction ratios
# {16, 4, 1, 1} per stage (N/16, N/4 clusters: sr = 4, 2; full attention in
# stages 3 and 4). One kv projection per stage. Published: 10.8 M params,
# 77.4 Top-1 (100 epochs), 41.8 mIoU.
_base_ = './clustr-t-multi-scale_8xb128_in1k.py'

model = dict(
    backbone=dict(
        arch=dict(
            _delete_=True,  # the base names the arch ('tiny')
            embed_dims=(64, 128, 256, 512),
            depths=(1, 2, 6, 1),
            num_heads=(1, 2, 4, 8),
            mlp_ratios=(8, 8, 4, 4),
            sr_ratios=(4, 2, 1, 1)),
        reducers=dict(scale_factors=(1, ))))

# ClusTR paper ablation: ClusTR-T with grid (PVT spatial-reduction) attention
# instead of clustering. Keys/values per stage from GridPool: conv with
# kernel = stride = sr (8, 4, 2) + LayerNorm, one kv projection; stage 4
# (sr 1) keeps full attention. Published: 13.2 M params, 76.7 Top-1
# (100 epochs).
_base_ = './clustr-t-multi-scale_8xb128_in1k.py'

model = dict(backbone=dict(reducers=dict(_delete_=True, type='GridPool')))

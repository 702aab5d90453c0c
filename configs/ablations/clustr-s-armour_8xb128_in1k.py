# ClusTR-S with Armour compact attention: values come from the query
# projection (queries from the patch tokens, values from the cluster tokens,
# one shared weight), so each scale keeps only a key projection. No
# published counterpart.
_base_ = '../clustr/clustr-s_8xb128_in1k.py'

model = dict(backbone=dict(compact_qv=True))

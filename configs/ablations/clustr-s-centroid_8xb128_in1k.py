# ClusTR-S with centroid attention as the key/value reducer: N/sr^2
# centroids per stage (sr = 8, 4, 2) initialised by a strided depthwise conv
# (kernel = stride = sr), then one attention update (T = 1, the stage's
# heads, softmax over the centroids); one kv projection; full attention in
# stage 4. No published counterpart.
_base_ = '../clustr/clustr-s_8xb128_in1k.py'

model = dict(
    backbone=dict(
        reducers=dict(type='CentroidAttention', init='conv', iters=1)))

# PaCa-S with centroid attention as the key/value reducer instead of the
# learned soft clustering: 100 centroids per stage (stages 1-3, as PaCa's
# clusters), initialised by adaptive average pooling to a 10 x 10 grid, then
# one attention update (T = 1, the stage's heads, softmax over the
# centroids); each block has its own. The cluster LayerNorm and separate k/v
# of PaCa stay. No published counterpart.
_base_ = '../paca/paca-s_8xb128_in1k.py'

model = dict(
    backbone=dict(
        # the reducers replace the soft clustering the base config names
        clustering=None,
        reducers=dict(type='CentroidAttention', init='pool', iters=1)))

# ClusTR-S with centroid attention as the key/value reducer: N/sr^2
# centroids per stage (sr = 8, 4, 2) initialised by a strided depthwise conv
# (kernel = stride = sr), then one attention update (T = 1, the stage's
# heads, softmax over the centroids); one kv projection; full attention in
# stage 4. No published counterpart.
_base_ = '../_base_/imagenet_8xb128-300e.py'

model = dict(
    backbone=dict(
        type='ClusTR', arch='small', clustering_mode='exact',
        drop_path_rate=0.1,
        reducers=dict(type='CentroidAttention', init='conv', iters=1)),
    head=dict(in_channels=512))
train_dataloader = dict(sampler=dict(type='RepeatAugSampler', shuffle=True))

# ClusTR-S with Armour compact attention: values come from the query
# projection (queries from the patch tokens, values from the cluster tokens,
# one shared weight), so each scale keeps only a key projection. No
# published counterpart.
_base_ = '../_base_/imagenet_8xb128-300e.py'

model = dict(
    backbone=dict(
        type='ClusTR', arch='small', clustering_mode='exact',
        drop_path_rate=0.1, compact_qv=True),
    head=dict(in_channels=512))
train_dataloader = dict(sampler=dict(type='RepeatAugSampler', shuffle=True))

# Mask R-CNN 1x on COCO with PaCa-ViT-S, the official recipe: multi-scale
# training (short side 480-800), AdamW lr 1e-4, wd 0.05, no weight decay on
# norms, batch 16 (8 GPUs x 2), 12 epochs.
_base_ = ['mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py']
# The Swin base's ImageNet URL; the backbone is replaced, so it must not show.
pretrained = None
custom_imports = dict(imports=['clustr_mm'], allow_failed_imports=False)

imagenet_checkpoint = 'work_dirs/paca-s_8xb128_in1k/epoch_300.pth'

model = dict(
    backbone=dict(
        _delete_=True,
        type='PaCaViT',
        arch='small',
        clustering='conv',
        drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(
            type='Pretrained', checkpoint=imagenet_checkpoint,
            prefix='backbone.')),
    neck=dict(in_channels=[96, 192, 320, 384]))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomChoiceResize',
         scales=[(1333, s) for s in range(480, 801, 32)], keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
# The base already uses AdamW lr 1e-4, wd 0.05 with no decay on norms.

# Mask R-CNN 1x on COCO with PaCa-ViT-S, the release's recipe
# (mask_rcnn_pacavit_small_p2cconv_100_0_mstrain_480_800_1x_coco): fine-tuned
# from the release's ImageNet classifier, drop path 0.1, multi-scale training
# (short side 480-800, or DETR-style resize -> 384-600 crop -> resize), AdamW
# lr 1e-4, wd 0.05, no weight decay on norms, 500 warm-up iterations, steps at
# epochs 8 and 11, batch 16 (8 GPUs x 2), 12 epochs. Differs from the release:
# nothing in the recipe.
_base_ = '../_base_/mask-rcnn_fpn_1x_coco.py'

imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_small_p2cconv_100_0.pth')

model = dict(
    # short of GPU memory: add with_cp=True (each block recomputed in the
    # backward pass; figures in docs/benchmarks.md)
    backbone=dict(
        type='PaCaViT',
        arch='small',
        clustering='conv',
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[96, 192, 320, 384]))

# The release's augmentation (from DETR): flip, then either a multi-scale
# resize or resize -> absolute-range crop 384-600 -> multi-scale resize.
multi_scale = dict(type='RandomChoiceResize',
                   scales=[(1333, s) for s in range(480, 801, 32)],
                   keep_ratio=True)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomChoice',
         transforms=[
             [multi_scale],
             [
                 dict(type='RandomChoiceResize',
                      scales=[(1333, 400), (1333, 500), (1333, 600)],
                      keep_ratio=True),
                 dict(type='RandomCrop', crop_type='absolute_range',
                      crop_size=(384, 600), allow_negative_crop=True),
                 multi_scale,
             ],
         ]),
    dict(type='PackDetInputs'),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
# The base already uses AdamW lr 1e-4, wd 0.05 with no decay on norms; the
# release warms up over mmdet's 1x schedule's 500 iterations (the Swin base:
# 1000).
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0,
         end=500),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True,
         milestones=[8, 11], gamma=0.1),
]

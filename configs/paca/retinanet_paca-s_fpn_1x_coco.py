# RetinaNet 1x on COCO with PaCa-ViT-S (AdamW lr 1e-4, wd 1e-4, batch 16),
# fine-tuned from the release's ImageNet classifier. Not in the release (no
# RetinaNet was published): the recipe is ClusTR's.
_base_ = '../_base_/retinanet_fpn_1x_coco.py'

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
    neck=dict(in_channels=[192, 320, 384]))

# Semantic FPN 80k on ADE20K with PaCa-ViT-S, fine-tuned from the release's
# ImageNet classifier. Not in the release (no Semantic FPN was published): same
# recipe as ClusTR's
# (AdamW lr 1e-4, wd 1e-4, poly 0.9 to 0). Segmentation uses 200 clusters per
# stage as the official code does; the ImageNet checkpoint's 100-cluster
# layers are re-initialised (with a warning) by the Pretrained loader.
_base_ = '../_base_/fpn_8xb2-80k_ade20k-512x512.py'

imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_small_p2cconv_100_0.pth')
model = dict(
    backbone=dict(
        type='PaCaViT',
        arch='small',
        clustering='conv',
        num_clusters=(200, 200, 200, 0),
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[96, 192, 320, 384]))

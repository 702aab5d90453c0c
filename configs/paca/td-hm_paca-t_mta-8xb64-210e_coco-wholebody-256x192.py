# PaCa-ViT-T in ClusTR's paper setting for whole-body pose (TCFormer's neck
# and recipe, a 1x1 head), fine-tuned from the release's ImageNet classifier.
# Not in the PaCa-ViT release. See
# td-hm_paca-s_mta-8xb64-210e_coco-wholebody-256x192.py.
_base_ = './td-hm_paca-s_mta-8xb64-210e_coco-wholebody-256x192.py'

imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_tiny_p2cconv_100_0.pth')
model = dict(
    backbone=dict(
        arch='tiny',
        init_cfg=dict(checkpoint=imagenet_checkpoint)))

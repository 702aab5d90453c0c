# PaCa-ViT-S in ClusTR's paper setting for whole-body pose (TCFormer's neck
# and recipe, a 1x1 head), fine-tuned from the release's ImageNet classifier.
# Not in the PaCa-ViT release (no pose model was published). See
# ../clustr/td-hm_clustr-s_mta-8xb64-210e_coco-wholebody-256x192.py; the
# simpler model (last stage + three deconvolutions):
# td-hm_paca-s_8xb64-210e_coco-wholebody-256x192.py.
_base_ = '../_base_/td-hm_mta-8xb64-210e_coco-wholebody-256x192.py'

imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_small_p2cconv_100_0.pth')
model = dict(
    backbone=dict(
        type='PaCaViT',
        arch='small',
        clustering='conv',
        drop_path_rate=0.0,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[96, 192, 320, 384]))

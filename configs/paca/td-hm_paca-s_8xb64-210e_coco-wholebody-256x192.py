# The simple alternative (last stage + three deconvolutions, SimpleBaseline):
# whole-body top-down pose with PaCa-ViT-S, fine-tuned from the release's
# ImageNet classifier. Not in the release (no pose model was published): same
# recipe and deconv head as the ClusTR-S deconv config (AdamW lr 5e-4, wd
# 0.01, 210 epochs, batch 512). ClusTR's paper setting (TCFormer's neck, a
# 1x1 head): td-hm_paca-s_mta-8xb64-210e_coco-wholebody-256x192.py.
_base_ = '../_base_/td-hm_8xb64-210e_coco-wholebody-256x192.py'

imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_small_p2cconv_100_0.pth')
model = dict(
    backbone=dict(
        type='PaCaViT',
        arch='small',
        clustering='conv',
        drop_path_rate=0.1,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    head=dict(in_channels=384))

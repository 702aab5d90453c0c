# UperNet 160k on ADE20K with PaCa-ViT-B: the release's
# upernet_pacavit_base_p2cconv_100_0_512x512_160k_ade20k recipe (that of PaCa-S,
# drop path 0.1 as in the release). Differs from the release: nothing.
_base_ = './upernet_paca-s_8xb2-160k_ade20k-512x512.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_base_p2cconv_100_0.pth')
model = dict(
    backbone=dict(arch='base', init_cfg=dict(checkpoint=imagenet_checkpoint)),
    decode_head=dict(in_channels=[96, 192, 384, 512]),
    auxiliary_head=dict(in_channels=384))

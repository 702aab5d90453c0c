# PaCa segmentation head 160k on ADE20K with PaCa-ViT-T: the release's
# pacahead_pacavit_tiny_p2cconv_100_0_512x512_160k_ade20k recipe (that of
# PaCa-S). Release weights (45.65 mIoU):
# https://github.com/iVMCL/PaCaViT/releases/download/pacavit/pacahead_pacavit_tiny_p2cconv_100_0_512x512_160k_ade20k.pth
# Differs from the release: as PaCa-S (segmentor class, norm_cfg key/value norms).
_base_ = './pacahead_paca-s_8xb2-160k_ade20k-512x512.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_tiny_p2cconv_100_0.pth')
model = dict(
    backbone=dict(arch='tiny', init_cfg=dict(checkpoint=imagenet_checkpoint)))

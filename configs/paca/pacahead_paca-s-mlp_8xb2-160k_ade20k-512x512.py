# PaCa segmentation head 160k on ADE20K with PaCa-ViT-S, MLP clustering: the
# release's pacahead_pacavit_small_p2cmlp_100_0_512x512_160k_ade20k recipe
# (that of PaCa-S). The release's lr x10 key ('clustering.4') matches no layer
# of the MLP clustering, so only the head gets x10; ours ('to_clusters') does
# not match the MLP's last layer ('fc2') either. Release weights (48.2 mIoU):
# https://github.com/iVMCL/PaCaViT/releases/download/pacavit/pacahead_pacavit_small_p2cmlp_100_0_512x512_160k_ade20k.pth
# Differs from the release: as PaCa-S (segmentor class, norm_cfg key/value norms).
_base_ = './pacahead_paca-s_8xb2-160k_ade20k-512x512.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_small_p2cmlp_100_0.pth')
model = dict(
    backbone=dict(clustering='mlp',
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))

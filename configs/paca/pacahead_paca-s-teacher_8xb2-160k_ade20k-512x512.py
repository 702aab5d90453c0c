# PaCa segmentation head 160k on ADE20K with PaCa-ViT-S-teacher (ConvMixer
# external clustering, 200 clusters in all four stages): the release's
# pacahead_pacavit_convmixer_small_100_512x512_160k_ade20k recipe (that of
# PaCa-S). The release's lr x10 key ('clustering.4') matches nothing in the
# teacher, so only the head gets x10. Release weights (46.2 mIoU):
# https://github.com/iVMCL/PaCaViT/releases/download/pacavit/pacahead_pacavit_convmixer_small_100_0_512x512_160k_ade20k.pth
# Differs from the release: as PaCa-S (segmentor class, norm_cfg key/value norms).
_base_ = './pacahead_paca-s_8xb2-160k_ade20k-512x512.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_convmixer_small_100.pth')
model = dict(
    backbone=dict(clustering='teacher', num_clusters=(200, 200, 200, 200),
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))
# The release's 'norm' group does not reach the teacher's BatchNorms (its
# modules are numbered, ours named norm*): keep their weight decay and lr.
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'teacher': dict(decay_mult=1.)}))

# PaCa-ViT paper ablation on ADE20K: the PaCa segmentation head 160k with
# PaCa-S trained on ImageNet with num_clusters=(49, 49, 49, 0), the release's
# upernet_pacavit_small_p2cconv_49_0_512x512_160k_ade20k file (named upernet_
# in the release, a PaCa-head segmentor: the official config is
# pacahead_pacavit_small_p2cconv_49_0_512x512_160k_ade20k.py). The recipe is
# PaCa-S's PaCa-head one; as in the official config the backbone is fine-tuned
# with downstream_cluster_num=[200, 200, 200, 0], i.e. num_clusters=(200, 200,
# 200, 0) (the classifier's cluster layers are re-initialised with a warning),
# from the release's IMNET_224_pacavit_small_p2cconv_49_0.pth.
# Differs from the release: as the PaCa-S PaCa-head config.
_base_ = '../paca/pacahead_paca-s_8xb2-160k_ade20k-512x512.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_small_p2cconv_49_0.pth')
model = dict(
    backbone=dict(num_clusters=(200, 200, 200, 0),
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))

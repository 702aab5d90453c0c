# PaCa-ViT paper ablation on ADE20K: the PaCa segmentation head 160k with
# PaCa-S trained on ImageNet with num_clusters=(100, 100, 100, 100), one
# clustering net per block, the release's
# upernet_pacavit_small_p2cconv_100_blockwise_512x512_160k_ade20k file (named
# upernet_ in the release, a PaCa-head segmentor: the official config is
# pacahead_pacavit_small_p2cconv_100_blockwise_512x512_160k_ade20k.py). The
# recipe is PaCa-S's PaCa-head one; as in the official config the backbone is
# fine-tuned with downstream_cluster_num=[200, 200, 200, 200], i.e.
# num_clusters=(200, 200, 200, 200), clustering_interval=1 (the classifier's
# cluster layers are re-initialised with a warning), from the release's
# IMNET_224_pacavit_small_p2cconv_100_blockwise.pth.
# Differs from the release: as the PaCa-S PaCa-head config.
_base_ = '../paca/pacahead_paca-s_8xb2-160k_ade20k-512x512.py'
imagenet_checkpoint = ('https://github.com/iVMCL/PaCaViT/releases/download/'
                       'pacavit/IMNET_224_pacavit_small_p2cconv_100_blockwise.pth')
model = dict(
    backbone=dict(num_clusters=(200, 200, 200, 200),
                  clustering_interval=1,
                  init_cfg=dict(checkpoint=imagenet_checkpoint)))

# UperNet 160k on ADE20K with PaCa-ViT-S, the release's
# upernet_pacavit_small_p2cconv_100_0_512x512_160k_ade20k recipe: fine-tuned from
# the release's ImageNet classifier with 200 clusters per stage (the file's
# 100-cluster layers are re-initialised with a warning), drop path 0.1, AdamW
# lr 6e-5, wd 0.01, no weight decay on norms, 1500 warm-up iterations, poly
# 1.0, batch 16 (8 GPUs x 2). Differs from the release: nothing.
_base_ = '../_base_/upernet_8xb2-160k_ade20k-512x512.py'

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
    decode_head=dict(in_channels=[96, 192, 320, 384]),
    auxiliary_head=dict(in_channels=320))
# The release's parameter groups: no weight decay on any parameter whose name
# has 'norm' (all of the backbone's LayerNorms; the heads' BatchNorms are
# named 'bn' and keep it, as in the release). No lr multipliers.
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={'norm': dict(decay_mult=0.)}))

# PaCa segmentation head 160k on ADE20K with PaCa-ViT-S: the release's
# pacahead_pacavit_small_p2cconv_100_0_512x512_160k_ade20k recipe. Fine-tuned
# from the release's ImageNet classifier with 200 clusters per reduced stage
# (the file's 100-cluster layers are re-initialised with a warning), drop path
# 0.1, AdamW lr 6e-5, betas (0.9, 0.999), wd 0.01, no weight decay on norms,
# lr x10 on the head and on the backbone's last clustering convs, 1500
# warm-up iterations then poly 1.0 to 0 at 160k, batch 16 (8 GPUs x 2),
# whole-image test. Release weights (48.3 mIoU):
# https://github.com/iVMCL/PaCaViT/releases/download/pacavit/pacahead_pacavit_small_p2cconv_100_0_512x512_160k_ade20k.pth
# Differs from the release: the segmentor is mmseg's EncoderDecoder (the
# release's PaCaEncoderDecoder only renamed the logged losses: its 'paca.*'
# are 'decode.paca.*' here); the key/value norms follow norm_cfg (the release
# hard-codes SyncBatchNorm there, which cannot run on one process).
_base_ = './upernet_paca-s_8xb2-160k_ade20k-512x512.py'

norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    decode_head=dict(
        _delete_=True,
        type='PaCaSegHead',
        in_channels=[96, 192, 320, 384],
        in_index=[0, 1, 2, 3],
        channels=256,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                         avg_non_ignore=True, loss_weight=1.0),
        aux_loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False,
                             avg_non_ignore=True, loss_weight=0.4)),
    auxiliary_head=None)
# The release's parameter groups (mmengine takes the longest matching key):
# lr x10 on the final clustering conv of each clustered stage (re-initialised
# for 200 clusters; the release's 'clustering.4') and on the whole decode
# head; no weight decay on any other parameter whose name has 'norm' (the
# backbone's LayerNorms; the head's BatchNorms are 'bn' and keep it).
optim_wrapper = dict(
    paramwise_cfg=dict(custom_keys={
        'norm': dict(decay_mult=0.),
        'head': dict(lr_mult=10.),
        'clustering.to_clusters': dict(lr_mult=10.),
    }))

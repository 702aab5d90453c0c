# PaCa-ViT-B with external clustering (ConvMixer teacher with its own FPN,
# 100 clusters in all 4 stages; student depths 3, 3, 16, 3, teacher 2, 2, 4, 2),
# trained from scratch with the PaCa-B recipe (gradient clipping at 1.0
# included) but drop path 0.1 (the official
# base-teacher model's; PaCa-B's is 0.5). Evaluation as the release's (see
# paca-s_8xb128_in1k.py); the release's classifier is
# IMNET_224_pacavit_convmixer_base_100.pth. Differs from the release: training
# augmentation is mmpretrain's, not the release's timm script.
_base_ = './paca-b_8xb128_in1k.py'
model = dict(backbone=dict(clustering='teacher', drop_path_rate=0.1))

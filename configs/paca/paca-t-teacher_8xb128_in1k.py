# PaCa-ViT-T with external clustering (student depths 2, 2, 2, 2, teacher
# 2, 2, 2, 2, 100 clusters in all 4 stages), trained from scratch with the
# PaCa-T recipe. The release has no ImageNet file for it (its tiny-teacher
# detector was fine-tuned from an unpublished one): this config makes the
# ImageNet weights that mask-rcnn_paca-t-teacher_fpn_ms-1x_coco.py loads.
_base_ = './paca-t_8xb128_in1k.py'
model = dict(backbone=dict(clustering='teacher'))

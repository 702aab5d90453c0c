# ClusTR-S whole-body pose as the paper trained it (ClusTR Table 5: 59.4 AP /
# 69.7 AR on COCO-WholeBody v1.0 val), "the same settings as TCFormer":
# - all four backbone stages feed MultiStageAggregation (TCFormer's MTA neck
#   on grids: 1x1 laterals to 256 channels, top-down nearest up-sampling and
#   addition, one pooled-key/value transformer block after each merge at
#   strides 16, 8 and 4); the head is one 1x1 conv to 133 heatmaps at stride
#   4 (no deconvolutions);
# - AdamW lr 5e-4, betas (0.9, 0.999), weight decay 0.01; linear warm-up over
#   500 iterations from 0.001 x lr, x0.1 at epochs 170 and 200, 210 epochs,
#   8 GPUs x 64 images; MSRAHeatmap sigma 2 (64x48 heatmaps); flip test with
#   the heatmap shifted by one pixel, standard decoding (no DARK); person
#   boxes of COCO_val2017_detections_AP_H_56_person.json.
# Data pipeline, test settings and metric: mmpose's HRNet whole-body config,
# mmpose 1.x's port of this recipe (one known difference from TCFormer's
# mmpose 0.x code: 1.x draws rotations as a normal truncated to +-1 times 80
# degrees, 0.x as a 40-degree normal clipped at +-80).
# No drop path (TCFormer's config has none). The simpler model, last stage +
# three deconvolutions: td-hm_clustr-s_8xb64-210e_coco-wholebody-256x192.py.
_base_ = '../_base_/td-hm_mta-8xb64-210e_coco-wholebody-256x192.py'

imagenet_checkpoint = 'work_dirs/clustr-s_8xb128_in1k/epoch_300.pth'

model = dict(
    backbone=dict(
        type='ClusTR',
        arch='small',
        clustering_mode='window',
        drop_path_rate=0.0,
        init_cfg=dict(checkpoint=imagenet_checkpoint)),
    neck=dict(in_channels=[64, 128, 256, 512]))

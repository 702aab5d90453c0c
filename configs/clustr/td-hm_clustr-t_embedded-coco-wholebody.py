# Whole-body top-down pose with ClusTR-T in the paper's model (all four
# stages through MultiStageAggregation, a 1x1 head) on the tiny embedded
# COCO-WholeBody, from scratch, sized for a CPU: 64x48 inputs, 16x12 heatmaps
# (sigma 1: the 256x192 setting's sigma 2 on 64x48 heatmaps, scaled), 60
# epochs of 2 iterations. Validation uses the ground-truth boxes, so that
# mmpose's PCKAccuracy (PCK@0.05 of the box size, all 133 keypoints) is
# computed beside the whole-body AP. The learning test and its margins:
# tests/test_pose_neck.py::test_embedded_config_learns, docs/embedded_data.md.
_base_ = '../_base_/td-hm_mta_embedded-coco-wholebody.py'

model = dict(
    backbone=dict(
        type='ClusTR',
        arch='tiny',
        clustering_mode='window'),
    neck=dict(in_channels=[64, 128, 256, 512]))

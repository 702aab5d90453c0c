# Negative control of the detection learning test: the embedded Mask R-CNN
# with ClusTR-T whose maps are channels-last (tests/configs/channels_last_maps.py),
# as in the RoIAlign bug of 2026-11-21. It must not pass the test's bar.
_base_ = '../../configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py'

custom_imports = dict(imports=['clustr_mm', 'channels_last_maps'],
                      allow_failed_imports=False)
model = dict(backbone=dict(_delete_=True, type='ChannelsLastMaps',
                           backbone=_base_.model.backbone))

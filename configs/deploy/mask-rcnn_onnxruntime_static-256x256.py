# mmdeploy deploy config: an mmdet two-stage instance-segmentation model
# (Mask R-CNN) to ONNX with NMS and RoIAlign in the graph (ONNX's own
# NonMaxSuppression and RoiAlign), for ONNX Runtime, at one fixed input size.
# ClusTR graphs need a fixed size (their clustering windows and cluster counts
# are fixed when traced); mmdeploy then resizes every image to this size
# (no aspect ratio kept). 256x256 is the embedded configs' size.
# Used by tools/deployment/mmdeploy_detection.py (docs/deployment.md).
onnx_config = dict(
    type='onnx',
    export_params=True,
    keep_initializers_as_inputs=False,
    opset_version=17,  # ClusTR's clustering uses tril (opset 14)
    save_file='end2end.onnx',
    input_names=['input'],
    output_names=['dets', 'labels', 'masks'],
    input_shape=[256, 256],  # mmdeploy's order: [width, height]
    optimize=True)
codebase_config = dict(
    type='mmdet',
    task='ObjectDetection',
    model_type='end2end',
    post_processing=dict(
        # the embedded configs' test_cfg (score_thr 0.001, 100 per image)
        score_threshold=0.001,
        confidence_threshold=0.001,
        iou_threshold=0.5,
        max_output_boxes_per_class=200,
        pre_top_k=5000,
        keep_top_k=100,
        background_label_id=-1,
        export_postprocess_mask=False))
backend_config = dict(type='onnxruntime')

# The static deploy config at the COCO configs' test size (1333x800 keeps
# the ratio; a static graph takes one size: 1344x800 is its padded form).
_base_ = './mask-rcnn_onnxruntime_static-256x256.py'
onnx_config = dict(input_shape=[1344, 800])  # [width, height]
codebase_config = dict(post_processing=dict(score_threshold=0.05))

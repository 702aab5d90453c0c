# The deploy config with a dynamic batch and image size, for backbones whose
# graph holds at any size (PaCa-ViT; not ClusTR: use a static config there).
_base_ = './mask-rcnn_onnxruntime_static-256x256.py'
onnx_config = dict(
    input_shape=None,
    dynamic_axes=dict(
        input={0: 'batch', 2: 'height', 3: 'width'},
        dets={0: 'batch', 1: 'num_dets'},
        labels={0: 'batch', 1: 'num_dets'},
        masks={0: 'batch', 1: 'num_dets', 2: 'height', 3: 'width'}))

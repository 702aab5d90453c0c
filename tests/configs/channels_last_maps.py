"""Test-only backbone wrapper: the wrapped backbone's maps, returned in
channels-last memory format.

It reproduces the RoIAlign bug of 2026-11-21 (ClusTR returned channels-last
views; mmcv's CPU RoIAlign reads its input as contiguous NCHW, so every RoI
feature of Mask R-CNN was scrambled): the negative control of the detection
learning test (tests/test_tools.py; figures in docs/embedded_data.md).
Imported through ``custom_imports`` with ``tests/configs`` on ``PYTHONPATH``.
"""
import torch
from mmengine.model import BaseModule
from mmengine.registry import MODELS


@MODELS.register_module(force=True)
class ChannelsLastMaps(BaseModule):
    """``backbone`` (a config) with every output map made channels-last."""

    def __init__(self, backbone: dict, init_cfg=None):
        super().__init__(init_cfg)
        self.backbone = MODELS.build(backbone)

    def forward(self, x: torch.Tensor):
        return tuple(f.contiguous(memory_format=torch.channels_last)
                     for f in self.backbone(x))

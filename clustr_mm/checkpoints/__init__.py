"""Checkpoints in and out: safe loading, and the official weights' converters.

``safe_pickle``: the allow-list unpickler (no code runs on load);
``loading``: reading weight files and filling a backbone, tolerant of a
changed cluster count; ``keys``: state-dict key helpers;
``clustr_official`` / ``paca_official``: official checkpoints -> our keys.

The converters read the backbones' arch tables inside their ``infer_*``
functions, so the models can import ``loading`` without an import circle.
"""
from .clustr_official import convert_clustr_official, infer_clustr_arch
from .keys import compare_state_dicts, strip_module_prefix, unwrap_state_dict
from .loading import (init_backbone_weights, load_backbone_state,
                      read_checkpoint)
from .paca_official import convert_paca_official, infer_paca_config
from .safe_pickle import allow_runner_checkpoint_types, safe_load

__all__ = [
    'allow_runner_checkpoint_types', 'compare_state_dicts',
    'convert_clustr_official', 'convert_paca_official', 'infer_clustr_arch',
    'infer_paca_config', 'init_backbone_weights', 'load_backbone_state',
    'read_checkpoint', 'safe_load', 'strip_module_prefix', 'unwrap_state_dict'
]

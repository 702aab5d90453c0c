"""Checkpoints in and out: safe loading, downloads, official weights.

``safe_pickle``: the allow-list unpickler (no code runs on load);
``download``: URLs into torch's hub cache, keyed by the whole URL, once;
``loading``: the one reader of weight files, registered as MMEngine's
loader; ``official``: the one converter protocol (detect a layout, convert
its keys, infer the config) and the one path a file takes through it, over ``clustr_official`` / ``paca_official``
(official checkpoints, and ClusTR's earlier keys -> ours); ``coverage_hook``: runner loads that leave weights out are refused;
``keys``: state-dict key helpers.

This package sits above the models (it reads the backbones' arch tables);
the backbones read files through MMEngine's loader only.
"""
from ..models.backbones.pretrained import load_backbone_state
from .clustr_official import (convert_clustr_legacy, convert_clustr_official,
                              infer_clustr_config)
from .coverage_hook import CheckpointCoverageHook, add_coverage_check
from .download import DownloadError, cache_path, download_checkpoint
from .keys import compare_state_dicts, strip_module_prefix, unwrap_state_dict
from .loading import (install_checkpoint_loaders, load_checkpoint_file,
                      read_checkpoint)
from .official import (CONVERTERS, Converter, convert_checkpoint,
                       find_converter)
from .paca_official import (convert_paca_official, infer_paca_config,
                            paca_official_layout)
from .safe_pickle import allow_runner_checkpoint_types, safe_load

__all__ = [
    'CheckpointCoverageHook', 'DownloadError', 'add_coverage_check',
    'allow_runner_checkpoint_types',
    'cache_path', 'compare_state_dicts', 'convert_clustr_official',
    'convert_checkpoint', 'convert_paca_official', 'download_checkpoint',
    'infer_clustr_config', 'infer_paca_config', 'install_checkpoint_loaders',
    'convert_clustr_legacy', 'CONVERTERS', 'Converter', 'find_converter',
    'load_backbone_state', 'load_checkpoint_file', 'paca_official_layout', 'read_checkpoint',
    'safe_load', 'strip_module_prefix', 'unwrap_state_dict'
]

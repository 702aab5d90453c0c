"""State-dict key helpers shared by checkpoint loading and the converters.

Unwrapping (``state_dict`` / ``model``, DataParallel's ``module.``) is
decided once, beside the backbones' own loader
(:mod:`~clustr_mm.models.backbones.pretrained`), and used from there.
"""
from typing import Dict, List, Mapping

import torch

from ..models.backbones.pretrained import (state_dict_key,
                                           strip_module_prefix,
                                           unwrap_state_dict)

StateDict = Dict[str, torch.Tensor]
__all__ = ['StateDict', 'state_dict_key', 'unwrap_state_dict',
           'strip_module_prefix', 'compare_state_dicts']


def compare_state_dicts(converted: Mapping[str, torch.Tensor],
                        expected: Mapping[str, torch.Tensor]
                        ) -> Dict[str, List[str]]:
    """Matched / missing / unexpected / shape-mismatched keys vs a model."""
    report = dict(matched=[], missing=[], unexpected=[], shape_mismatch=[])
    for key, value in converted.items():
        if key not in expected:
            report['unexpected'].append(key)
        elif tuple(value.shape) != tuple(expected[key].shape):
            report['shape_mismatch'].append(
                f'{key}: {tuple(value.shape)} vs {tuple(expected[key].shape)}')
        else:
            report['matched'].append(key)
    report['missing'] = [k for k in expected if k not in converted]
    return report

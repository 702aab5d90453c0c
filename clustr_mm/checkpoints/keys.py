"""State-dict key helpers shared by checkpoint loading and the converters."""
from typing import Dict, List, Mapping, Optional

import torch

StateDict = Dict[str, torch.Tensor]


def state_dict_key(checkpoint: Mapping) -> Optional[str]:
    """``'model'`` or ``'state_dict'``, whichever wraps the weights, or None
    for a bare state dict."""
    for key in ('model', 'state_dict'):
        if key in checkpoint and isinstance(checkpoint[key], Mapping):
            return key
    return None


def unwrap_state_dict(checkpoint: Mapping) -> Mapping[str, torch.Tensor]:
    """The state dict inside ``{'model': ...}`` / ``{'state_dict': ...}``."""
    key = state_dict_key(checkpoint)
    return checkpoint if key is None else checkpoint[key]


def strip_module_prefix(state: Mapping[str, torch.Tensor]
                        ) -> Mapping[str, torch.Tensor]:
    """Drop the ``module.`` prefix of a DataParallel / DDP state dict."""
    if state and all(k.startswith('module.') for k in state):
        return {k[len('module.'):]: v for k, v in state.items()}
    return state


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

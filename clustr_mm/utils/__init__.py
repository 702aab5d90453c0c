from .convert import (compare_state_dicts, convert_clustr_official,
                      infer_clustr_arch, unwrap_state_dict)
from .safe_pickle import allow_runner_checkpoint_types

__all__ = [
    'allow_runner_checkpoint_types', 'compare_state_dicts',
    'convert_clustr_official', 'infer_clustr_arch', 'unwrap_state_dict'
]

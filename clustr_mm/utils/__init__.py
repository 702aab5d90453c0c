from .safe_pickle import allow_runner_checkpoint_types

__all__ = ['allow_runner_checkpoint_types']

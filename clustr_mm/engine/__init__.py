"""Run helpers: the train/test launch set-up (``launch``), fixed-length runs
(``short_run``), atomic checkpoint writes (``atomic_io``) and the hook that
makes resume continue the random streams (``random_state_hook``)."""
from .atomic_io import use_atomic_local_writes
from .random_state_hook import RandomStateHook

__all__ = ['RandomStateHook', 'use_atomic_local_writes']

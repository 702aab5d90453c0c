"""Run helpers: the train/test launch set-up (``launch``), fixed-length runs
(``short_run``), atomic checkpoint writes (``atomic_io``), the choice of the
checkpoint to resume (``resume``), and what registers with MMEngine: the hook
that makes resume continue the random streams (``random_state_hook``), the
hook that stops a diverged run before it saves (``fail_fast_hook``), the
hook naming the settings a resumed checkpoint replaces
(``resume_settings_hook``), the
CPU bf16 optimizer wrapper (``amp``) and the official ImageNet runs'
learning-rate curve (``warmup_cosine``)."""
from .amp import CPUAmpOptimWrapper
from .atomic_io import use_atomic_local_writes
from .fail_fast_hook import FailFastHook
from .random_state_hook import RandomStateHook
from .resume_settings_hook import ResumeSettingsHook
from .warmup_cosine import WarmupCosineLR

__all__ = ['CPUAmpOptimWrapper', 'FailFastHook', 'RandomStateHook',
           'ResumeSettingsHook', 'WarmupCosineLR', 'use_atomic_local_writes']

"""Mixed precision for ``--amp``: MMEngine's on a GPU, bf16 autocast on a CPU.

MMEngine's ``AmpOptimWrapper`` refuses a machine without an accelerator (and
its loss scaler is an fp16 tool). bf16 has fp32's exponent range, so a CPU run
needs only the autocast, no scaling: :class:`CPUAmpOptimWrapper`.
"""
from contextlib import contextmanager

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module(force=True)
class CPUAmpOptimWrapper(OptimWrapper):
    """``OptimWrapper`` whose forward runs under CPU bf16 autocast."""

    def __init__(self, dtype='bfloat16', **kwargs):
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(
                f'CPUAmpOptimWrapper: dtype must be bfloat16 (the only CPU '
                f'autocast type), got {dtype!r}')
        super().__init__(**kwargs)

    @contextmanager
    def optim_context(self, model):
        with super().optim_context(model), torch.autocast(
                'cpu', dtype=torch.bfloat16):
            yield


def use_amp(cfg, dtype=None) -> str:
    """Switch ``cfg.optim_wrapper`` to mixed precision; returns its type.

    GPU: ``AmpOptimWrapper`` (``dtype`` None/'float16' with dynamic loss
    scaling, or 'bfloat16'). CPU: :class:`CPUAmpOptimWrapper`, bf16 only.
    """
    wrapper = cfg.optim_wrapper
    kind = wrapper.get('type', 'OptimWrapper')
    amp_kinds = ('AmpOptimWrapper', 'CPUAmpOptimWrapper')
    if kind not in ('OptimWrapper', *amp_kinds):
        raise ValueError(
            f"--amp: the config's optim_wrapper is a {kind}; only an "
            'OptimWrapper can be switched to mixed precision')
    if torch.cuda.is_available():
        wrapper.type = 'AmpOptimWrapper'
        wrapper.setdefault('loss_scale', 'dynamic')
        if dtype is not None:
            wrapper.dtype = dtype
    else:
        if dtype not in (None, 'bfloat16'):
            raise ValueError(
                f'--amp {dtype} needs a GPU (MMEngine\'s AmpOptimWrapper); '
                'on the CPU only bfloat16 autocast exists')
        wrapper.type = 'CPUAmpOptimWrapper'
        wrapper.pop('loss_scale', None)
        wrapper.pop('dtype', None)
    return wrapper.type

"""Mixed precision for ``--amp``: MMEngine's on a GPU, bf16 autocast on a CPU.

MMEngine's ``AmpOptimWrapper`` refuses a machine without an accelerator (and
its loss scaler is an fp16 tool). bf16 has fp32's exponent range, so a CPU run
needs only the autocast, no scaling: :class:`CPUAmpOptimWrapper`.
"""
from contextlib import contextmanager

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS


# mmcv ops whose CPU kernels take fp32 only (torch's autocast does not know
# them): (module, autograd Function, how many leading tensor arguments)
FP32_ONLY_CPU_OPS = (('mmcv.ops.nms', 'NMSop', 2),
                     ('mmcv.ops.roi_align', 'RoIAlignFunction', 2))


def _reduced_on_cpu(t) -> bool:
    return (isinstance(t, torch.Tensor) and t.device.type == 'cpu'
            and t.dtype in (torch.bfloat16, torch.float16))


def _fp32_on_cpu(forward, count: int):
    """``forward`` of an autograd Function, given its first ``count`` tensors
    in fp32 when they are reduced-precision CPU tensors; a floating result
    comes back in the first such tensor's dtype (what the caller allocated
    around it, e.g. mmdet's RoI feature buffer), an index result as it is."""
    def cast_forward(ctx, *args, **kwargs):
        head = list(args[:count])
        dtype = next((t.dtype for t in head if _reduced_on_cpu(t)), None)
        ctx._clustr_mm_dtype = dtype
        if dtype is None:
            return forward(ctx, *args, **kwargs)
        head = [t.float() if isinstance(t, torch.Tensor)
                and t.is_floating_point() else t for t in head]
        out = forward(ctx, *head, *args[count:], **kwargs)
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            out = out.to(dtype)
        return out
    cast_forward._clustr_mm_fp32 = True
    cast_forward.__wrapped__ = forward
    return staticmethod(cast_forward)


def _fp32_grads_on_cpu(backward):
    """``backward`` of such a Function, given fp32 gradients when its
    forward ran cast (autograd casts what it returns to the inputs'
    dtypes)."""
    def cast_backward(ctx, *grads):
        if getattr(ctx, '_clustr_mm_dtype', None) is not None:
            grads = [g.float() if _reduced_on_cpu(g) else g for g in grads]
        return backward(ctx, *grads)
    cast_backward.__wrapped__ = backward
    return staticmethod(cast_backward)


def install_cpu_amp_op_casts() -> list:
    """Let mmcv's fp32-only CPU ops run under CPU bf16 autocast (Mask
    R-CNN's NMS and RoIAlign get bf16 boxes and features there): their
    inputs and gradients are cast to fp32 around them, features come back
    in bf16. Idempotent; ops of an mmcv that is not
    installed (or lacks them) are skipped. Returns the ops patched now."""
    import importlib
    patched = []
    for module_name, name, count in FP32_ONLY_CPU_OPS:
        try:
            function = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError, OSError):
            continue
        forward = function.forward
        if getattr(forward, '_clustr_mm_fp32', False):
            continue
        function.forward = _fp32_on_cpu(forward, count)
        function.backward = _fp32_grads_on_cpu(function.backward)
        patched.append(f'{module_name}.{name}')
    return patched


@OPTIM_WRAPPERS.register_module(force=True)
class CPUAmpOptimWrapper(OptimWrapper):
    """``OptimWrapper`` whose forward runs under CPU bf16 autocast.

    Building one also lets mmcv's fp32-only CPU ops (NMS, RoIAlign) take
    bf16 inputs (:func:`install_cpu_amp_op_casts`)."""

    def __init__(self, dtype='bfloat16', **kwargs):
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(
                f'CPUAmpOptimWrapper: dtype must be bfloat16 (the only CPU '
                f'autocast type), got {dtype!r}')
        super().__init__(**kwargs)
        install_cpu_amp_op_casts()

    @contextmanager
    def optim_context(self, model):
        with super().optim_context(model), torch.autocast(
                'cpu', dtype=torch.bfloat16):
            yield


# the optimizer wrappers that train in mixed precision
AMP_WRAPPERS = ('AmpOptimWrapper', 'CPUAmpOptimWrapper')


def use_amp(cfg, dtype=None) -> str:
    """Switch ``cfg.optim_wrapper`` to mixed precision; returns its type.

    GPU: ``AmpOptimWrapper`` (``dtype`` None/'float16' with dynamic loss
    scaling, or 'bfloat16'). CPU: :class:`CPUAmpOptimWrapper`, bf16 only,
    refused for mmpose configs (its heatmap head cannot take bf16).
    """
    wrapper = cfg.optim_wrapper
    kind = wrapper.get('type', 'OptimWrapper')
    if kind not in ('OptimWrapper', *AMP_WRAPPERS):
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
        if cfg.get('default_scope') == 'mmpose':
            raise ValueError(
                '--amp on the CPU (bfloat16 autocast) cannot train an mmpose '
                "config: mmpose's heatmap head turns the bf16 heatmaps into "
                'numpy arrays for its accuracy (TypeError: Got unsupported '
                'ScalarType BFloat16). Train pose configs in fp32 on the '
                'CPU, or with --amp on a GPU (fp16)')
        wrapper.type = 'CPUAmpOptimWrapper'
        wrapper.pop('loss_scale', None)
        wrapper.pop('dtype', None)
    return wrapper.type

"""Traffic census: the bytes each op moves, its FLOPs and a roofline bound.

Beside the op census (``op_census``, launches and syncs), this counts what
caps a GPU once launches are cheap: memory traffic. A ``TorchDispatchMode``
sees every aten op (and custom op, e.g. the fused clustering, as one op) at
the dtype it runs in (after autocast's casts, which are ops too) on any
device, the CPU included. Per op:

- bytes read: every tensor argument's elements (a broadcast, stride-0
  dimension once) at its element size; bytes written: every output's;
- FLOPs: ``torch.utils.flop_counter``'s formula for the op (2 per
  multiply-add), 0 where it has none (element-wise ops, reductions); our
  own for ``convolution_backward`` (:func:`_conv_backward_flops`);
- a time bound, ``max(bytes / BANDWIDTH, FLOPs / peak, LAUNCH_S)``, with the
  dense peak for ops with bf16/fp16 inputs, the 3xTF32 peak for the fused
  clustering op in its 'tf32x3' precision, and the fp32 peak otherwise.

The constants are an H100 SXM's, rounded: 3.0 TB/s, ~600 TFLOP/s dense
bf16/fp16 (tensor cores), ~50 TFLOP/s fp32 on CUDA cores, 2.5 us per kernel;
3xTF32 is three dense TF32 products (~495 TFLOP/s) per fp32 product,
~165 TFLOP/s.
Ops that launch nothing (views, ``empty``) are left out.

``scale`` extrapolates a small batch to a large one: reads of weights (and
of views and casts computed from weights alone, such as autocast's weight
casts), and the whole of ops on weights alone, are kept; all other bytes and
FLOPs are multiplied by ``scale``; the op count is not scaled.
"""
import math
from collections import defaultdict
from typing import Callable, Dict, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .op_census import VIEW_OPS, _tensors

BANDWIDTH = 3.0e12  # bytes/s
DENSE_PEAK = 600e12  # FLOP/s, bf16/fp16 on tensor cores
FP32_PEAK = 50e12  # FLOP/s, fp32 on CUDA cores
TF32X3_PEAK = 495e12 / 3  # FLOP/s, fp32 products as 3 TF32 tensor-core ones
LAUNCH_S = 2.5e-6  # s per kernel
NO_KERNEL = VIEW_OPS | frozenset(('empty', 'empty_like', 'empty_strided',
                                  'new_empty', 'new_empty_strided'))
HALF = (torch.bfloat16, torch.float16)


def _nbytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor view covers."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride:
            n *= size
    return n * t.element_size() if t.numel() else 0


def _conv_backward_flops(grad_output, input, weight, bias_sizes, stride,
                         padding, dilation, transposed, output_padding,
                         groups, output_mask) -> int:
    """FLOPs of ``aten.convolution_backward``: each gradient it computes
    (``output_mask``: input, weight; the bias's is a sum) costs what the
    forward convolution does. ``torch.utils.flop_counter`` (2.0-2.14)
    counts the weight gradient of a grouped convolution as if every group
    saw every input channel, ``groups`` times too many: 512x for the
    depthwise 3x3 of ClusTR's and PVTv2's MLPs (the whole 800x1344
    training step of ClusTR-S came to 10.6 TFLOP instead of ~2)."""
    # the forward: every element of its smaller side (the output, or the
    # input when transposed) times one filter slice, weight.shape[1:]
    side = input if transposed else grad_output
    forward = 2 * side.numel() * math.prod(weight.shape[1:])
    return forward * sum(1 for m in output_mask[:2] if m)


def _flops(func, args, kwargs, out) -> int:
    from torch.utils.flop_counter import flop_registry
    packet = func.overloadpacket
    if packet is torch.ops.aten.convolution_backward:
        return _conv_backward_flops(*args, **kwargs)
    if packet is getattr(torch.ops.aten,
                         '_scaled_dot_product_flash_attention_for_cpu', None):
        # the CPU's flash attention: the CUDA one's formula (q, k, v first)
        packet = torch.ops.aten._scaled_dot_product_flash_attention
    formula = flop_registry.get(packet)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))


def time_bound(nbytes: float, flops: float, half: bool,
               tf32x3: bool = False) -> float:
    """Roofline seconds of one kernel (see the module docstring)."""
    peak = DENSE_PEAK if half else TF32X3_PEAK if tf32x3 else FP32_PEAK
    return max(nbytes / BANDWIDTH, flops / peak, LAUNCH_S)


# The fused clustering ops and where their precision argument sits.
_PRECISION_ARG = {'dpc_knn': 6, 'dpc_knn_merge': 10}


def _tf32x3(func, args, kwargs) -> bool:
    """Whether ``func`` is a fused clustering op (the DPC-kNN, or the
    clustering and merge around it) in 'tf32x3' precision."""
    ops = getattr(torch.ops, 'clustr_mm', None)
    name = func.overloadpacket.__name__
    if name not in _PRECISION_ARG or func.overloadpacket is not getattr(
            ops, name, None):
        return False
    precision = kwargs.get('precision')
    if precision is None and len(args) > _PRECISION_ARG[name]:
        precision = args[_PRECISION_ARG[name]]
    return precision == 'tf32x3'


class TrafficCensus(TorchDispatchMode):
    """Records the bytes read (from weights and from the rest), written,
    FLOPs and input dtype of every kernel-launching op while active.
    ``static``: tensors (weights) whose traffic does not grow with the
    batch."""

    def __init__(self, static: Iterable[torch.Tensor] = ()):
        super().__init__()
        self._static = {self._key(t) for t in static}
        self.records = []

    @staticmethod
    def _key(t: torch.Tensor):
        # Not id(): a tensor's Python object may be remade between ops.
        # Storage address, shape and dtype: an activation reusing a freed
        # weight cast's memory differs from it in shape (batch dims).
        return t.data_ptr(), tuple(t.shape), t.dtype

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        ins = [t for t in _tensors(list(args) + list(kwargs.values()))]
        outs = list(_tensors([out]))
        # static: computed from weights alone (views and casts of them)
        static = bool(ins) and all(self._key(t) in self._static
                                   for t in ins)
        if static:
            self._static.update(self._key(t) for t in outs)
        if name in NO_KERNEL:
            return out
        half = any(t.dtype in HALF for t in ins)
        fixed = sum(_nbytes(t) for t in ins if self._key(t) in self._static)
        self.records.append(dict(
            op=(name if func.namespace == 'aten' else
                f'{func.namespace}::{name}'),
            read_fixed=fixed,
            read=sum(_nbytes(t) for t in ins) - fixed,
            written=sum(_nbytes(t) for t in outs),
            flops=_flops(func, args, kwargs, out), half=half,
            tf32x3=_tf32x3(func, args, kwargs), static=static))
        return out

    def summary(self, scale: float = 1.0, top: int = 10) -> Dict[str, object]:
        """Totals (bytes, FLOPs, time bound, ops), the ``top`` ops by time
        bound summed by op name, and every op's count, with ``scale``
        applied."""
        by_op = defaultdict(lambda: dict(count=0, bytes=0.0, flops=0.0,
                                         time_s=0.0))
        totals = dict(ops=len(self.records), bytes_read=0.0,
                      bytes_written=0.0, flops=0.0, time_bound_s=0.0)
        for r in self.records:
            f = 1.0 if r['static'] else scale
            read = r['read_fixed'] + r['read'] * f
            written, flops = r['written'] * f, r['flops'] * f
            bound = time_bound(read + written, flops, r['half'], r['tf32x3'])
            row = by_op[r['op']]
            row['count'] += 1
            row['bytes'] += read + written
            row['flops'] += flops
            row['time_s'] += bound
            totals['bytes_read'] += read
            totals['bytes_written'] += written
            totals['flops'] += flops
            totals['time_bound_s'] += bound
        totals['bytes'] = totals['bytes_read'] + totals['bytes_written']
        ranked = sorted(by_op.items(), key=lambda kv: -kv[1]['time_s'])
        totals['top_ops'] = [dict(op=k, **v) for k, v in ranked[:top]]
        totals['op_counts'] = {k: v['count'] for k, v in ranked}
        return totals


def traffic_census(fn: Callable[[], object], warmup: int = 1,
                   static: Iterable[torch.Tensor] = (), scale: float = 1.0,
                   top: int = 10) -> Dict[str, object]:
    """Traffic of one ``fn()`` call after ``warmup`` uncounted ones (which
    build size-only set-up, as once per size in a real run). ``fn`` chooses
    grad mode itself (a training step runs its backward inside)."""
    for _ in range(warmup):
        fn()
    census = TrafficCensus(static)
    with census:
        fn()
    return census.summary(scale, top)


def roofline_constants() -> str:
    """The constants, for help texts and reports."""
    return (f'{BANDWIDTH / 1e12:.1f} TB/s, {DENSE_PEAK / 1e12:.0f} TFLOP/s '
            f'bf16/fp16, {FP32_PEAK / 1e12:.0f} TFLOP/s fp32, '
            f'{TF32X3_PEAK / 1e12:.0f} TFLOP/s fp32 as 3xTF32, '
            f'{LAUNCH_S * 1e6:.1f} us per kernel')

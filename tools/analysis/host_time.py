"""Host time of one forward: the Python and dispatch work a GPU waits on.

    python tools/analysis/host_time.py [--batch 2] [--sizes 800x1344] \
        [--models clustr-s-window pvtv2-b2 swin-t] [--runs 20] [--out x.json]

Why: at batch 2 a GPU finishes small kernels faster than the host issues
them, and the forward then takes the host's time, not the kernels'. This
measures that host time on any machine, without a GPU. Each backbone runs
its eval forward on the ``meta`` device: every aten op is dispatched and
its output shape computed, no arithmetic is done and no memory is touched,
so the wall time is the model's Python plus torch's dispatch per op, at
the real input size. ClusTR takes its CUDA path (``FUSED_PLAN``), as in
``op_census.py``: one clustering-and-merge op per attention.

What the worker changes in its own process to run on ``meta`` (the model
code is untouched):

- torch's Python meta kernels (``torch._meta_registrations``, written for
  FakeTensor) are swapped for the C++ ones wherever an op has one: the
  C++ meta function is the same shape code a CUDA kernel runs on the host
  before its launch, where the Python one costs 100-1000 us an op (add:
  ~150 us against ~1 us). Ops with no C++ meta kernel keep the Python one;
  the row counts them (``python_meta_ops``: time a GPU does not spend).
- autocast queries for device ``meta`` (which has no autocast) are
  answered as for the CPU: the models switch autocast off around their
  clustering by the input's device type.

Not in the figure: the kernel launches themselves (a few us each on a
GPU), the allocator, autocast's casts (``--amp`` is not offered: autocast
does not act on ``meta`` tensors) and the fused DPC-kNN op's body (its
Python and Triton launches); the clustering-and-merge op around it runs
its body (:func:`clustering_body_on_meta`). The row also gives the ops of the same meta
forward (``clustr_mm.analysis.op_census``, equal to ``op_census.py``'s
count) and host microseconds per op. Ratios to ``pvtv2-b2`` of the same
run close each size. Models, rows and the child process per (model, size)
are ``benchmark_common.py``'s.
"""
import os.path as osp
import statistics
import sys
import time

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from benchmark_common import (Table, cuda_path, parse_common,  # noqa: E402
                              parser_for, prepare, run, run_info)

REFERENCE = 'pvtv2-b2'
# the Library holding the Python meta kernels kept: registered while it lives
_KEPT = []


def use_cpp_meta_kernels():
    """Let ops on ``meta`` run their C++ meta kernels (the host-side shape
    code of the CUDA kernels) instead of torch's Python ones, which cost
    100x more and would be most of the measured time; returns the ops
    (overloads) left with a Python meta kernel, or None
    where this torch keeps them elsewhere (nothing changed)."""
    from torch._decomp import global_decomposition_table
    import torch._meta_registrations as registrations
    library = getattr(registrations, '_meta_lib_dont_use_me_use_register_meta',
                      None)
    if library is None or not hasattr(library, '_destroy'):
        return None
    python_metas = {}  # as torch's activate_meta picks them
    for kind in ('meta', 'post_autograd', 'pre_autograd'):
        for op, fn in global_decomposition_table[kind].items():
            python_metas.setdefault(op, fn)
    registered = {key.rsplit('/', 1)[0] for key in library._op_impls}
    library._destroy()  # every Python meta kernel: the C++ ones act again
    kept = torch.library.Library('aten', 'IMPL', 'Meta')
    left = set()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for op, fn in python_metas.items():
        if not isinstance(op, torch._ops.OpOverload):
            continue
        name = op.name()
        if name.replace('::', '/') not in registered or has(name, 'Meta'):
            continue
        if op is torch.ops.aten.convolution.default:
            fn = keeps_channels_last(fn)
        # no C++ kernel for meta: the Python one stays, timed
        kept.impl(op, timed(fn))
        left.add(op)
    _KEPT.append(kept)
    return left


# seconds spent in the Python meta kernels kept (outermost calls only)
PY_META = dict(seconds=0.0, depth=0)


def timed(meta):
    """``meta`` adding its time to :data:`PY_META`: host time a GPU does
    not spend (its shape code is C++), taken out of ``host_ms_cpp``."""

    def run(*args, **kwargs):
        PY_META['depth'] += 1
        start = time.perf_counter()
        try:
            return meta(*args, **kwargs)
        finally:
            PY_META['depth'] -= 1
            if not PY_META['depth']:
                PY_META['seconds'] += time.perf_counter() - start
    return run


def keeps_channels_last(meta):
    """A convolution meta kernel whose output keeps a channels-last input's
    layout, as the CPU and cuDNN kernels do (torch's meta writes NCHW: a
    ``transpose`` after it is then no view, and each such linear costs a
    copy, an ``mm`` and an ``add`` instead of one ``addmm``)."""

    def convolution(input, weight, *args):
        out = meta(input, weight, *args)
        if (out.dim() == 4 and not input.is_contiguous()
                and input.is_contiguous(memory_format=torch.channels_last)):
            _, c, h, w = out.shape
            out = out.as_strided(out.shape, (h * w * c, 1, w * c, c))
        return out

    return convolution


def autocast_on_meta():
    """Answer autocast's questions about device ``meta`` as for the CPU
    (``torch.autocast('meta', enabled=False)`` and
    ``torch.is_autocast_enabled('meta')`` raise): the models ask them by
    the input's device type around their clustering."""

    def as_cpu(device_type):
        kind = getattr(device_type, 'type', device_type)
        return 'cpu' if kind == 'meta' else device_type

    class Autocast(torch.autocast):
        def __init__(self, device_type, *args, **kwargs):
            super().__init__(as_cpu(device_type), *args, **kwargs)

    def asks(query):
        def ask(*args, **kwargs):
            if args:
                args = (as_cpu(args[0]), *args[1:])
            return query(*args, **kwargs)
        return ask

    torch.autocast = Autocast
    torch.is_autocast_enabled = asks(torch.is_autocast_enabled)
    torch.get_autocast_dtype = asks(torch.get_autocast_dtype)


def fused_attention_on_meta():
    """``F.scaled_dot_product_attention`` on ``meta`` as one fused op, as on
    a GPU (flash or memory-efficient attention): torch picks the fused
    kernel per device and has no pick for ``meta``, where it would run the
    math decomposition (about 7 ops a call). The models call it by
    ``F.scaled_dot_product_attention`` at call time."""
    import torch.nn.functional as F
    eager = F.scaled_dot_product_attention
    fused = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default

    def attention(query, key, value, attn_mask=None, dropout_p=0.0,
                  is_causal=False, scale=None, **kwargs):
        if query.device.type != 'meta' or kwargs:
            return eager(query, key, value, attn_mask, dropout_p, is_causal,
                         scale, **kwargs)
        out = fused(query, key, value, dropout_p, is_causal,
                    attn_mask=attn_mask, scale=scale)[0]
        # laid out (B, L, H, D) in memory as the kernels write it (the
        # Python meta writes (B, H, L, D)): merging the heads is a view
        b, h, n, d = out.shape
        return out.as_strided(out.shape, (n * h * d, d, h * d, 1))

    F.scaled_dot_product_attention = attention


def clustering_body_on_meta():
    """ClusTR's clustering-and-merge op (``clustr_mm::dpc_knn_merge``) runs
    its body on ``meta``, not its shape-only fake: the windows' cut, the
    ids' offsets and the merge are Python and dispatches the host does on
    a GPU too (there the merge is two Triton launches, here the torch merge
    in their place). The fused DPC-kNN inside keeps its fake; registered
    while the returned Library lives."""
    from clustr_mm.ops.dpc_knn.merge import dpc_knn_merge_body
    library = torch.library.Library('clustr_mm', 'IMPL')
    library.impl('dpc_knn_merge', dpc_knn_merge_body, 'Meta')
    return library


class OpsIn(TorchDispatchMode):
    """Counts the dispatched calls of the given op overloads."""

    def __init__(self, ops):
        super().__init__()
        self.ops, self.calls = ops, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func in self.ops
        return func(*args, **(kwargs or {}))


def measure(name, size, args):
    """One (model, size) on ``meta``; runs inside the child process."""
    from clustr_mm.analysis.op_census import op_census
    python_metas = use_cpp_meta_kernels()
    autocast_on_meta()
    fused_attention_on_meta()
    _KEPT.append(clustering_body_on_meta())
    model, x, row = prepare(name, size, args, counted=True)
    cuda_path(model)
    model.to('meta')
    x = torch.empty_like(x, device='meta')

    def forward():
        return model(x)

    times, cpp = [], []
    with torch.no_grad():
        for _ in range(args.warmup + args.runs):
            PY_META['seconds'] = 0.0
            start = time.perf_counter()
            forward()
            times.append(time.perf_counter() - start)
            cpp.append(times[-1] - PY_META['seconds'])
    runs = times[args.warmup:]
    python_ops = OpsIn(python_metas or set())

    def counted():
        with python_ops:
            return forward()

    census = op_census(counted, warmup=0)
    host_ms = statistics.median(runs) * 1e3
    row.update(
        runtime='meta', host_ms=host_ms, host_runs_ms=[t * 1e3 for t in runs],
        host_ms_cpp=statistics.median(cpp[args.warmup:]) * 1e3,
        first_forward_ms=times[0] * 1e3, ops=census['ops'],
        host_syncs=census['host_syncs'], by_op=census['by_op'],
        host_us_per_op=host_ms * 1e3 / max(census['ops'], 1),
        meta_kernels='python' if python_metas is None else 'c++',
        python_meta_ops=None if python_metas is None else python_ops.calls)
    return row


class HostTable(Table):

    def header(self):
        return (f'{"model":16s} {"size":>9s} {"host_ms":>8s} {"cpp_ms":>7s} '
                f'{"ops":>6s} {"us/op":>6s} {"py_meta":>7s}  '
                'runs ms (min-max)')

    def cells(self, r):
        runs = r['host_runs_ms']
        py_meta = ('-' if r['python_meta_ops'] is None else
                   str(r['python_meta_ops']))
        return (f'{r["host_ms"]:8.2f} {r["host_ms_cpp"]:7.2f} {r["ops"]:6d} '
                f'{r["host_us_per_op"]:6.1f} {py_meta:>7s}  '
                f'{min(runs):.1f}-{max(runs):.1f}')

    def ratios(self, rows):
        """Each model's host time over ``pvtv2-b2``'s of the same run and
        size (kept in the rows as ``host_vs_pvtv2_b2``)."""
        ref = next((r for r in rows
                    if r['model'] == REFERENCE and 'host_ms' in r), None)
        if ref is None:
            return []
        lines = [f'  host time relative to {REFERENCE} at {ref["size"]} '
                 '(all; without Python meta kernels):']
        for r in rows:
            if 'host_ms' in r:
                r['host_vs_pvtv2_b2'] = r['host_ms'] / ref['host_ms']
                r['cpp_vs_pvtv2_b2'] = r['host_ms_cpp'] / ref['host_ms_cpp']
                lines.append(f'    {r["model"]:16s} '
                             f'{r["host_vs_pvtv2_b2"]:.2f}x, '
                             f'{r["cpp_vs_pvtv2_b2"]:.2f}x')
        return lines


def parse_args(argv):
    parser = parser_for(__doc__, device=False, amp=False)
    # a meta forward costs milliseconds: more runs, for a steadier median
    parser.set_defaults(models=['clustr-s-window', REFERENCE, 'swin-t'],
                        sizes=['800x1344'], batch=2, runs=20, warmup=3)
    return parse_common(parser, argv)


def main(argv=None):
    argv = sys.argv if argv is None else argv
    args = parse_args(argv[1:])
    info = None if args.worker else run_info(args, argv, runtime='meta')
    return run(osp.abspath(__file__), args, argv, measure, HostTable(args),
               info)


if __name__ == '__main__':
    main()

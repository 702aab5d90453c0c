"""Op census: how many aten ops a forward pass runs, and how many host syncs.

On a GPU every aten op that does work is (at least) one kernel launch, and
every read of device values by the host stops the host until the device
catches up. Counting both with a ``TorchDispatchMode`` on any device, the CPU
included, tracks the launch- and sync-bound behaviour of a model without a
GPU.

A host sync is counted for:

- ``_local_scalar_dense``: what ``.item()``, ``int(t)``, ``bool(t)`` and
  ``float(t)`` run;
- ops whose output size depends on the values (``nonzero``, so also
  ``torch.where(cond)``; ``masked_select``, the ``unique`` family,
  ``bincount``, ``repeat_interleave`` with tensor repeats and no
  ``output_size``, indexing with a boolean mask) and ``equal``/``allclose``,
  which answer a Python bool;
- copies from a device to the CPU (``.cpu()``, ``.to('cpu')``,
  ``.tolist()`` of a GPU tensor);
- ``.tolist()`` and ``.numpy()`` of a CPU tensor: no dispatched op reads the
  values there, so a ``TorchFunctionMode`` counts them (on a GPU the same
  call is a device-to-host copy).

Metadata-only ops (views) are not counted as ops: they launch nothing.
Ops that a kernel calls internally are not seen (the mode sees the outer op
only), hence the rules above by op and argument.

The project's own ops (namespace ``clustr_mm``, e.g. ClusTR's clustering
and merge) are one op each, but they launch several kernels on a GPU: the
census also counts, per call, the launches inside them (``launches``,
``launches_per_call``): the aten ops they dispatch (allocations and views
excepted), and for the fused DPC-kNN op the launches of its CUDA path
(:func:`~clustr_mm.ops.dpc_knn.fused.gpu_launches`, which a CPU census
cannot run).
"""
from collections import Counter
from typing import Callable, Dict, List

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Ops that only make a new view of existing storage.
VIEW_OPS = frozenset((
    'view', '_unsafe_view', 't', 'transpose', 'permute', 'unsqueeze',
    'squeeze', 'slice', 'select', 'expand', 'as_strided', 'detach', 'alias',
    'diagonal', 'unbind', 'split', 'narrow', 'unfold', 'split_with_sizes',
    'view_as_real', 'view_as_complex', 'lift_fresh'))
# Ops that sync whatever their arguments.
SYNC_OPS = frozenset((
    '_local_scalar_dense', 'nonzero', 'masked_select', '_unique', '_unique2',
    'unique_dim', 'unique_consecutive', 'unique_dim_consecutive', 'bincount',
    'equal', 'allclose'))
# Indexing ops that run ``nonzero`` on a boolean mask index.
MASK_INDEX_OPS = frozenset(('index', 'index_put', 'index_put_',
                            '_index_put_impl_'))
COPY_OPS = frozenset(('_to_copy', 'copy_', 'copy'))
# Ops that allocate without writing: no launch.
ALLOC_OPS = frozenset(('empty', 'empty_like', 'new_empty', 'empty_strided',
                       'new_empty_strided'))
OWN_NAMESPACE = 'clustr_mm'

HOST_READS = ('tolist', 'numpy')


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


def _syncs(func, name: str, args, kwargs, out) -> bool:
    """Whether this dispatched call makes the host wait for the device."""
    if name in SYNC_OPS:
        return True
    if name in MASK_INDEX_OPS:
        return any(t.dtype in (torch.bool, torch.uint8)
                   for t in _tensors(args[1:2]))
    if name == 'repeat_interleave':
        return (func._overloadname == 'Tensor'
                and kwargs.get('output_size') is None)
    if name in COPY_OPS:
        to_host = any(t.device.type == 'cpu' for t in _tensors([out]))
        return to_host and any(t.device.type not in ('cpu', 'meta')
                               for t in _tensors(args))
    return False


class OpCensus(TorchDispatchMode):
    """Counts dispatched aten ops by name (overload dropped) and the host
    syncs among them while active; per call of the project's own ops, the
    launches inside (module docstring)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.syncs: Counter = Counter()
        self.inside: Dict[str, List[int]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        if _own(func):
            launches, out = _launches_inside(func, args, kwargs)
            self.inside.setdefault(name, []).append(launches)
        else:
            out = func(*args, **kwargs)
        if _syncs(func, name, args, kwargs, out):
            self.syncs[name] += 1
        return out

    def summary(self) -> Dict[str, object]:
        """``ops`` (views excluded), ``host_syncs``, the per-op counts and the
        syncs by op; ``launches``: the ops with each own op counted as the
        launches inside it, and ``launches_per_call`` of the own ops (the
        most of any call)."""
        work = Counter({k: v for k, v in self.ops.items()
                        if k not in VIEW_OPS})
        own = sum(len(calls) for calls in self.inside.values())
        inside = sum(sum(calls) for calls in self.inside.values())
        return dict(ops=sum(work.values()),
                    host_syncs=sum(self.syncs.values()),
                    launches=sum(work.values()) - own + inside,
                    launches_per_call={k: max(v)
                                       for k, v in self.inside.items()},
                    by_op=dict(work.most_common()),
                    syncs_by_op=dict(self.syncs.most_common()))


def _own(func) -> bool:
    return str(func).split('.', 1)[0] == OWN_NAMESPACE  # 'ns.op.overload'


class _Inside(TorchDispatchMode):
    """Counts the launches of what one own op dispatches."""

    def __init__(self):
        super().__init__()
        self.launches = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _own(func):
            launches, out = _launches_inside(func, args, kwargs)
            self.launches += launches
            return out
        if torch._C._dispatch_has_kernel_for_dispatch_key(
                func.name(), 'CompositeImplicitAutograd'):
            # below autograd (inside an op) composite ops such as reshape
            # arrive whole: count what they decompose into
            with self:
                return func.decompose(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name not in VIEW_OPS and name not in ALLOC_OPS:
            self.launches += 1
        return func(*args, **kwargs)


def _launches_inside(func, args, kwargs):
    """(launches, output) of one call of an own op on its CUDA path, which
    the CPU does not run (it runs other code in the kernels' place): the
    fused DPC-kNN's as :func:`~clustr_mm.ops.dpc_knn.fused.gpu_launches`
    lists them; the clustering-and-merge op's as
    :func:`~clustr_mm.ops.dpc_knn.merge.gpu_launches` counts them (a
    dispatch mode does not see inside an op it hands on)."""
    name = func.overloadpacket.__name__
    if name == 'dpc_knn':
        from ..ops.dpc_knn.fused import gpu_launches
        return len(gpu_launches(*args, **kwargs)), func(*args, **kwargs)
    if name != 'dpc_knn_merge':
        raise NotImplementedError(
            f'the op census does not know what {func.name()} launches: add '
            'it to op_census._launches_inside')
    from ..ops.dpc_knn.merge import gpu_launches
    return gpu_launches(_Inside(), *args, **kwargs), func(*args, **kwargs)


class _HostReads(TorchFunctionMode):
    """Adds ``.tolist()``/``.numpy()`` of CPU tensors to a census's syncs."""

    def __init__(self, census: OpCensus):
        super().__init__()
        self.census = census

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, '__name__', '')
        if (name in HOST_READS and args and isinstance(args[0], torch.Tensor)
                and args[0].device.type == 'cpu'):
            self.census.syncs[name] += 1
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def op_census(fn: Callable[[], object], warmup: int = 1) -> Dict[str, object]:
    """Census of one ``fn()`` call after ``warmup`` uncounted calls.

    The warm-up lets size-dependent set-up (window layouts, cached masks) be
    built first, as it is once per input size in a real run. Returns
    :meth:`OpCensus.summary`'s dict.
    """
    for _ in range(warmup):
        fn()
    census = OpCensus()
    with census, _HostReads(census):
        fn()
    return census.summary()

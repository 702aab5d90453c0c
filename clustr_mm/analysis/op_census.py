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
"""
from collections import Counter
from typing import Callable, Dict

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
    syncs among them while active."""

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()
        self.syncs: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        out = func(*args, **kwargs)
        if _syncs(func, name, args, kwargs, out):
            self.syncs[name] += 1
        return out

    def summary(self) -> Dict[str, object]:
        """``ops`` (views excluded), ``host_syncs``, the per-op counts and the
        syncs by op."""
        work = Counter({k: v for k, v in self.ops.items()
                        if k not in VIEW_OPS})
        return dict(ops=sum(work.values()),
                    host_syncs=sum(self.syncs.values()),
                    by_op=dict(work.most_common()),
                    syncs_by_op=dict(self.syncs.most_common()))


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
    ``dict(ops=..., host_syncs=..., by_op=..., syncs_by_op=...)``.
    """
    for _ in range(warmup):
        fn()
    census = OpCensus()
    with census, _HostReads(census):
        fn()
    return census.summary()

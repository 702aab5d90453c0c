"""FLOP counting that includes attention and clustering work.

Convention: ``mmengine.analysis.FlopAnalyzer`` (fvcore's jit-trace counter):
one multiply-add is one FLOP; convolutions, linears, matmuls/bmm, einsum,
norms, pooling and upsampling are counted; element-wise activations, softmax
and data movement are not. This is the convention of the FLOP tables of
PVT, Swin, PaCa-ViT and mmdet/mmseg's ``get_flops``. On top of it:

- ``aten::scaled_dot_product_attention`` (fused attention, which
  ``FlopAnalyzer`` does not know): ``B*H*N*M*(d_k + d_v)``, i.e. ``q k^T``
  and the weighted sum of ``v``; the softmax is not counted, as for any model.
- ``aten::_native_multi_head_attention`` (``nn.MultiheadAttention``'s fused
  inference path): the four projections plus the attention products.
- ``aten::topk``/``aten::sort``: one comparison per input element;
  ``aten::index_add``/``scatter_add``: one add per source element;
  ``aten::cdist``: one multiply-add per pair and channel.
- DPC-kNN clustering (ClusTR's reducer) is counted *analytically*, not from
  the trace: its cost must not depend on the image, its loops are chunked
  for memory, and one step is data dependent. Each :class:`DPCKNN` reducer
  call on B images, C channels and a grid tiled into windows (exact mode:
  one window per image) contributes, for G windows of n tokens that are
  clustered into at most K centers (counts ``m_s`` per scale):

  * ``clustering.distances`` = ``G * (n*n + n*K) * (C + 2)``: all squared
    token-token distances (one GEMM of ``[x, |x|^2, 1]`` by
    ``[-2x, 1, |x|^2]``, hence C + 2) and the token-center distances.
  * ``clustering.selection`` = ``G * (2*n*n + n*k + 2*n + n*sum(m_s))``
    comparisons: k-nearest-neighbour selection (n per row), the search for
    the nearest denser token counted as a full scan of the distance matrix
    (n per row, as the official code does it), the kNN density (k per
    token), the two rankings (density, score; n each) and the nearest-center
    choice (m_s per token and scale).
  * ``clustering.merge`` = ``B * N * (C + 1)`` per clustered scale: the
    weighted sums of the members and of their weights.

  A scale whose cluster count equals the number of tokens of every window
  is the identity (nothing is clustered, nothing counted). Windows whose
  every clustered scale is the identity are skipped, as in the code. This
  is the algorithm's work (the reference implementation, what a jit trace
  records); not counted: the fast paths' own layout of the work (padded
  border windows; the blocked path's second pass over the denser half of
  the distances; the fused op's recomputed distance tiles), the index
  bookkeeping, and the ``exp`` of the token weights.

:func:`analyze_flops` runs the count and sorts it into parts of the model
(patch embedding, attention projections, attention products, clustering,
MLP, neck, heads); :func:`count_flops` is the per-operator shortcut.
"""
from collections import Counter, OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from mmengine.analysis import FlopAnalyzer
from mmengine.analysis.jit_handles import get_shape
from torch import nn

from ..protocols import clustering_ops, flop_kind


def _prod(shape):
    out = 1
    for s in shape:
        out *= s
    return out


def sdpa_flop(inputs, outputs):
    q, k, v = (get_shape(t) for t in inputs[:3])
    *batch, n, dk = q
    m, dv = k[-2], v[-1]
    return _prod(batch) * n * m * (dk + dv)


def native_mha_flop(inputs, outputs):
    q, k = get_shape(inputs[0]), get_shape(inputs[1])
    b, n, c = q
    m = k[1]
    # q, k, v, out projections + q k^T + attn v
    return b * (2 * n * c * c + 2 * m * c * c + 2 * n * m * c)


def scan_flop(inputs, outputs):
    """topk/sort: one comparison per input element."""
    return _prod(get_shape(inputs[0]))


def merge_flop(inputs, outputs):
    """index_add / scatter_add: one add per source element (input 3)."""
    return _prod(get_shape(inputs[3]))


def cdist_flop(inputs, outputs):
    x1, x2 = get_shape(inputs[0]), get_shape(inputs[1])
    return _prod(x1) * x2[-2]


EXTRA_HANDLES = {
    'aten::scaled_dot_product_attention': sdpa_flop,
    'aten::_native_multi_head_attention': native_mha_flop,
    'aten::topk': scan_flop,
    'aten::sort': scan_flop,
    'aten::index_add': merge_flop,
    'aten::index_add_': merge_flop,
    'aten::scatter_add': merge_flop,
    'aten::scatter_add_': merge_flop,
    'aten::cdist': cdist_flop,
}

# Operator names of the attention products (FlopAnalyzer's names).
ATTENTION_PRODUCT_OPS = ('scaled_dot_product_attention',
                         '_native_multi_head_attention', 'matmul', 'bmm',
                         'baddbmm', 'einsum')
CLUSTERING_OPS = ('clustering.distances', 'clustering.selection',
                  'clustering.merge')


def flop_analyzer(model: nn.Module, inputs) -> FlopAnalyzer:
    """A FlopAnalyzer with the attention and clustering handles registered."""
    analyzer = FlopAnalyzer(model, inputs)
    analyzer.set_op_handle(**EXTRA_HANDLES)
    analyzer.unsupported_ops_warnings(False)
    analyzer.uncalled_modules_warnings(False)
    analyzer.tracer_warnings('none')
    return analyzer


# --------------------------------------------------------------------------
# DPC-kNN, counted analytically


def _is_dpc_knn(module: nn.Module) -> bool:
    """DPC-kNN reducers (the ``DPCKNN`` token reducer)."""
    from ..models.layers.dpc_knn import DPCKNN
    return isinstance(module, DPCKNN)


def dpc_knn_macs(reducer: nn.Module, batch: int, channels: int,
                 hw: Tuple[int, int]) -> Counter:
    """Multiply-adds of one DPC-kNN reducer call (see the module docstring):
    this module's FLOPs, one per multiply-add. (The fused op's
    ``dpc_knn_flops`` counts two per multiply-add, as
    ``torch.utils.flop_counter`` does: ``_flops`` names that convention,
    ``_macs`` this one.)

    Args:
        reducer: A DPCKNN reducer (its ``window_size``,
            ``sr_ratio``, ``scale_factors`` and ``k`` are read).
        batch, channels: B and C of the (B, H*W, C) tokens.
        hw: (H, W) of the token grid.

    Returns:
        Counter with ``clustering.distances``, ``clustering.selection`` and
        ``clustering.merge``.
    """
    from ..ops.dpc_knn import TRACE_PLAN, WindowLayout
    h, w = int(hw[0]), int(hw[1])
    layout = WindowLayout((h, w), reducer.window_size, reducer.sr_ratio,
                          reducer.scale_factors, plan=TRACE_PLAN)
    scales = layout.clustered
    out = Counter(dict.fromkeys(CLUSTERING_OPS, 0))
    if not scales:
        return out
    c, k = channels, reducer.k
    # The algorithm's work, window by window: what a jit trace runs
    # (dpc_knn.TRACE_PLAN). A GPU runs more where it pads border
    # windows, a CPU where it recomputes distances to denser tokens.
    for i, n in enumerate(layout.tokens):
        counts = [layout.counts[s][i] for s in scales]
        if all(cnt == n for cnt in counts):
            continue  # every clustered scale is the identity here
        big_k = max(counts)
        out['clustering.distances'] += batch * (n * n + n * big_k) * (c + 2)
        out['clustering.selection'] += batch * (2 * n * n + n * min(k, n) +
                                                2 * n + n * sum(counts))
    out['clustering.merge'] += len(scales) * batch * h * w * (c + 1)
    return out


# --------------------------------------------------------------------------
# Tracing helpers


def _int_sizes(module, args, kwargs):
    """Forward pre-hook: (H, W) tuples traced as 0-dim tensors -> ints.

    Under ``torch.jit.trace`` ``x.shape[i]`` is a 0-dim tensor, which Python
    code that computes window layouts from ``hw`` cannot use. The trace is
    only used for counting, so freezing the sizes is harmless.
    """
    if not torch.jit.is_tracing():
        return None

    def fix(a):
        if (isinstance(a, (tuple, list)) and a
                and all(isinstance(t, torch.Tensor) and t.dim() == 0
                        and not t.is_floating_point() for t in a)):
            return type(a)(int(t) for t in a)
        return a

    return (tuple(fix(a) for a in args),
            {k: fix(v) for k, v in kwargs.items()})


def _grid_arg(args, kwargs):
    """The (H, W) argument of a reducer call: ``hw=`` or the first tuple."""
    if 'hw' in kwargs:
        return kwargs['hw']
    for a in args[1:]:
        if isinstance(a, (tuple, list)) and len(a) == 2:
            return a
    raise ValueError('cannot find the (H, W) argument of a DPC-kNN call')


@contextmanager
def _counting_hooks(model: nn.Module, calls: List[tuple]):
    """Install the size pre-hooks and the DPC-kNN recorders for one trace."""
    names = {id(m): n for n, m in model.named_modules()}
    handles = []

    def record(module, args, kwargs, output):
        x = kwargs['x'] if 'x' in kwargs else args[0]
        b, _, c = (int(s) for s in x.shape)
        hw = tuple(int(s) for s in _grid_arg(args, kwargs))
        calls.append((names[id(module)], module, b, c, hw))

    try:
        for m in model.modules():
            handles.append(
                m.register_forward_pre_hook(_int_sizes, with_kwargs=True))
            if _is_dpc_knn(m):
                handles.append(
                    m.register_forward_hook(record, with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


# --------------------------------------------------------------------------
# Sorting counts into parts of the model

KINDS = ('embedding', 'attention projections', 'attention products',
         'clustering', 'mlp', 'other')


def _library_kinds() -> List[Tuple[type, str]]:
    """The marks of the mm libraries' modules (the backbones measured beside
    ours: PVTv2, Swin), which carry no ``flop_kind`` of their own."""
    marks: List[Tuple[type, str]] = [(nn.MultiheadAttention, 'attention')]
    try:
        from mmcv.cnn.bricks.transformer import (FFN, MultiheadAttention,
                                                 PatchEmbed, PatchMerging)
        marks += [(MultiheadAttention, 'attention'), (FFN, 'mlp'),
                  (PatchEmbed, 'embedding'), (PatchMerging, 'embedding')]
        from mmdet.models.backbones.pvt import MixFFN
        from mmdet.models.backbones.swin import ShiftWindowMSA
        marks += [(MixFFN, 'mlp'), (ShiftWindowMSA, 'attention')]
    except ImportError:  # without mmcv / mmdet: none of their modules
        pass
    return marks


def _marked_kind(module: Optional[nn.Module],
                 library: List[Tuple[type, str]]) -> Optional[str]:
    """The ``flop_kind`` a module is marked with (ours: declared as
    :mod:`clustr_mm.protocols` says; the mm libraries': by class), or None."""
    kind = flop_kind(module)
    if kind is None and module is not None:
        kind = next((k for cls, k in library if isinstance(module, cls)),
                    None)
    return kind


def _kind(path: List[str], modules: Dict[str, nn.Module], op: str,
          library: List[Tuple[type, str]]) -> str:
    """Kind of an operator run directly by the module at ``path``: the mark
    of the nearest marked module on the path ('attention': its products,
    its ``clustering_ops`` and otherwise its projections)."""
    if op in CLUSTERING_OPS:
        return 'clustering'
    for depth in range(len(path), 0, -1):
        module = modules.get('.'.join(path[:depth]))
        kind = _marked_kind(module, library)
        if kind is None:
            continue
        if kind == 'attention':
            if op in clustering_ops(module):
                return 'clustering'  # PaCa: assignment @ tokens
            return ('attention products' if op in ATTENTION_PRODUCT_OPS
                    else 'attention projections')
        return kind
    return 'other'


@dataclass
class FlopReport:
    """Result of :func:`analyze_flops`; all counts in FLOPs (= MACs)."""
    total: int
    by_operator: Counter
    by_part: 'OrderedDict[str, int]'
    by_module: Dict[str, Counter] = field(repr=False)
    uncounted_ops: Counter = field(default_factory=Counter)

    def part(self, *prefixes: str) -> int:
        return sum(v for k, v in self.by_part.items()
                   if k.startswith(prefixes))

    def kind(self, kind: str) -> int:
        """One kind summed over all parts, e.g. ``'clustering'``."""
        return sum(v for k, v in self.by_part.items()
                   if k.split('/')[-1] == kind)

    @property
    def without_attention_and_clustering(self) -> int:
        """The count without attention products and clustering: the
        convention of the ClusTR paper's FLOP figures."""
        return (self.total - self.kind('attention products') -
                self.kind('clustering'))


def _part_of(name: str, has_backbone: bool) -> Tuple[str, List[str]]:
    path = name.split('.') if name else []
    if not has_backbone:
        return 'backbone', path
    if not path:
        return 'other', path
    if path[0] == 'backbone':
        return 'backbone', path
    if path[0].startswith('neck'):
        return 'neck', path
    return 'heads', path


def analyze_flops(model: nn.Module,
                  inputs: Union[torch.Tensor, Tuple],
                  forward: Optional[Callable] = None) -> FlopReport:
    """Count the FLOPs of one forward of ``model`` (no grad, current mode).

    Args:
        model: The module to trace. Module names in the report are relative
            to it; when it has a ``backbone`` child, the counts are split into
            backbone (by kind), neck and heads.
        inputs: Positional inputs of the traced call.
        forward: Optional replacement of ``model.forward`` for the trace
            (e.g. a detector's tensor path); restored afterwards.
    """
    inputs = inputs if isinstance(inputs, tuple) else (inputs, )
    calls: List[tuple] = []
    saved = model.__dict__.get('forward')
    if forward is not None:
        model.forward = forward
    try:
        with _counting_hooks(model, calls), torch.no_grad():
            analyzer = flop_analyzer(model, inputs)
            per_module = {k: Counter(v) for k, v in
                          analyzer.by_module_and_operator().items()}
            uncounted = Counter(analyzer.unsupported_ops())
            for name, *_ in calls:  # ops inside DPC-kNN: counted analytically
                uncounted.subtract(analyzer.unsupported_ops(name))
            uncounted = +uncounted
    finally:
        if forward is not None:
            if saved is None:
                del model.forward
            else:
                model.forward = saved

    # Replace the traced count of every DPC-kNN call by the analytic one.
    reducers = {name for name, *_ in calls}
    analytic: Dict[str, Counter] = {name: Counter() for name in reducers}
    for name, module, b, c, hw in calls:
        analytic[name].update(dpc_knn_macs(module, b, c, hw))
    for name in reducers:
        delta = Counter(analytic[name])
        delta.subtract(per_module.get(name, Counter()))
        parts = name.split('.')
        for i in range(len(parts) + 1):
            anc = '.'.join(parts[:i])
            if anc in per_module:
                per_module[anc].update(delta)
                per_module[anc] = +per_module[anc]  # drop zeros
        for sub in list(per_module):
            if sub.startswith(name + '.'):
                per_module[sub] = Counter()

    # Exclusive counts per module -> (part, kind).
    modules = dict(model.named_modules())
    has_backbone = 'backbone' in modules
    children: Dict[str, List[str]] = {}
    for name in per_module:
        if name:
            parent = name.rsplit('.', 1)[0] if '.' in name else ''
            children.setdefault(parent, []).append(name)
    by_part: Dict[str, int] = Counter()
    library = _library_kinds()
    for name, counts in per_module.items():
        own = Counter(counts)
        for child in children.get(name, ()):
            own.subtract(per_module[child])
        part, path = _part_of(name, has_backbone)
        for op, value in own.items():
            if not value:
                continue
            key = (f'{part}/{_kind(path, modules, op, library)}'
                   if part == 'backbone' else part)
            by_part[key] += value
    order = [f'backbone/{k}' for k in KINDS] + ['neck', 'heads', 'other']
    ordered = OrderedDict((k, by_part[k]) for k in order if by_part.get(k))
    total_ops = +per_module.get('', Counter())
    return FlopReport(
        total=sum(total_ops.values()), by_operator=total_ops,
        by_part=ordered, by_module=per_module, uncounted_ops=uncounted)


def count_flops(model: nn.Module, shape: Sequence[int]) -> Counter:
    """FLOPs of one ``model(x)`` with ``x`` of ``shape``, by operator."""
    was_training = model.training
    model.eval()
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(*shape, generator=gen)
        return analyze_flops(model, x).by_operator
    finally:
        model.train(was_training)

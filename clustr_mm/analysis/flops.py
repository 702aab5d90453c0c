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
  for memory, and one step is data dependent. Each :class:`DPCKNNClustering`
  call on B images, C channels and a grid tiled into windows (exact mode:
  one window per image) contributes, for G windows of n tokens that are
  clustered into at most K centers (counts ``m_s`` per scale):

  * ``clustering.distances`` = ``G * (n*n + n*K) * (C + 2)``: all squared
 (token_clustering.TRACE_PLAN). A GPU runs moretoken-token distances (one GEMM of ``[x, |x|^2, 1]`` by
 (token_clustering.TRACE_PLAN). A GPU runs more``[-2x, 1, |x|^2]``, hence C + 2) and the token-center distances.
  * ``clustering.selection`` = ``G * (2*n*n + n*k + 2*n + n*sum(m_s))``
 (token_clustering.TRACE_PLAN). A GPU runs morecomparisons: k-nearest-neighbour selection (n per row), the search for
 (token_clustering.TRACE_PLAN). A GPU runs morethe nearest denser token counted as a full scan of the distance matrix
 (token_clustering.TRACE_PLAN). A GPU runs more(n per row, as the official code does it), the kNN density (k per
 (token_clustering.TRACE_PLAN). A GPU runs moretoken), the two rankings (density, score; n each) and the nearest-center
 (token_clustering.TRACE_PLAN). A GPU runs morechoice (m_s per token and scale).
  * ``clustering.merge`` = ``B * N * (C + 1)`` per clustered scale: the
 (token_clustering.TRACE_PLAN). A GPU runs moreweighted sums of the members and of their weights.

  A scale whose cluster count equals the number of tokens of every window
  is the identity (nothing is clustered, nothing counted). Windows whose
  every clustered scale is the identity are skipped, as in the code. Not
  counted: our implementation's distance recomputation for local density
  peaks (data dependent, typically a few percent of the distances), the
  index bookkeeping, and the ``exp`` of the token weights.

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


def _prod(shape):
 (token_clustering.TRACE_PLAN). A GPU runs moreout = 1
 (token_clustering.TRACE_PLAN). A GPU runs morefor s in shape:
 (token_clustering.TRACE_PLAN). A GPU runs more    out *= s
 (token_clustering.TRACE_PLAN). A GPU runs morereturn out


def sdpa_flop(inputs, outputs):
 (token_clustering.TRACE_PLAN). A GPU runs moreq, k, v = (get_shape(t) for t in inputs[:3])
 (token_clustering.TRACE_PLAN). A GPU runs more*batch, n, dk = q
 (token_clustering.TRACE_PLAN). A GPU runs morem, dv = k[-2], v[-1]
 (token_clustering.TRACE_PLAN). A GPU runs morereturn _prod(batch) * n * m * (dk + dv)


def native_mha_flop(inputs, outputs):
 (token_clustering.TRACE_PLAN). A GPU runs moreq, k = get_shape(inputs[0]), get_shape(inputs[1])
 (token_clustering.TRACE_PLAN). A GPU runs moreb, n, c = q
 (token_clustering.TRACE_PLAN). A GPU runs morem = k[1]
 (token_clustering.TRACE_PLAN). A GPU runs more# q, k, v, out projections + q k^T + attn v
 (token_clustering.TRACE_PLAN). A GPU runs morereturn b * (2 * n * c * c + 2 * m * c * c + 2 * n * m * c)


def scan_flop(inputs, outputs):
 (token_clustering.TRACE_PLAN). A GPU runs more"""topk/sort: one comparison per input element."""
 (token_clustering.TRACE_PLAN). A GPU runs morereturn _prod(get_shape(inputs[0]))


def merge_flop(inputs, outputs):
 (token_clustering.TRACE_PLAN). A GPU runs more"""index_add / scatter_add: one add per source element (input 3)."""
 (token_clustering.TRACE_PLAN). A GPU runs morereturn _prod(get_shape(inputs[3]))


def cdist_flop(inputs, outputs):
 (token_clustering.TRACE_PLAN). A GPU runs morex1, x2 = get_shape(inputs[0]), get_shape(inputs[1])
 (token_clustering.TRACE_PLAN). A GPU runs morereturn _prod(x1) * x2[-2]


EXTRA_HANDLES = {
 (token_clustering.TRACE_PLAN). A GPU runs more'aten::scaled_dot_product_attention': sdpa_flop,
 (token_clustering.TRACE_PLAN). A GPU runs more'aten::_native_multi_head_attention': native_mha_flop,
 (token_clustering.TRACE_PLAN). A GPU runs more'aten::topk': scan_flop,
 (token_clustering.TRACE_PLAN). A GPU runs more'aten::sort': scan_flop,
 (token_clustering.TRACE_PLAN). A GPU runs more'aten::index_add': merge_flop,
 (token_clustering.TRACE_PLAN). A GPU runs more'aten::index_add_': merge_flop,
 (token_clustering.TRACE_PLAN). A GPU runs more'aten::scatter_add': merge_flop,
 (token_clustering.TRACE_PLAN). A GPU runs more'aten::scatter_add_': merge_flop,
 (token_clustering.TRACE_PLAN). A GPU runs more'aten::cdist': cdist_flop,
}

# Operator names of the attention products (FlopAnalyzer's names).
ATTENTION_PRODUCT_OPS = ('scaled_dot_product_attention',
 (token_clustering.TRACE_PLAN). A GPU runs more                     '_native_multi_head_attention', 'matmul', 'bmm',
 (token_clustering.TRACE_PLAN). A GPU runs more                     'baddbmm', 'einsum')
CLUSTERING_OPS = ('clustering.distances', 'clustering.selection',
 (token_clustering.TRACE_PLAN). A GPU runs more              'clustering.merge')


def flop_analyzer(model: nn.Module, inputs) -> FlopAnalyzer:
 (token_clustering.TRACE_PLAN). A GPU runs more"""A FlopAnalyzer with the attention and clustering handles registered."""
 (token_clustering.TRACE_PLAN). A GPU runs moreanalyzer = FlopAnalyzer(model, inputs)
 (token_clustering.TRACE_PLAN). A GPU runs moreanalyzer.set_op_handle(**EXTRA_HANDLES)
 (token_clustering.TRACE_PLAN). A GPU runs moreanalyzer.unsupported_ops_warnings(False)
 (token_clustering.TRACE_PLAN). A GPU runs moreanalyzer.uncalled_modules_warnings(False)
 (token_clustering.TRACE_PLAN). A GPU runs moreanalyzer.tracer_warnings('none')
 (token_clustering.TRACE_PLAN). A GPU runs morereturn analyzer


# --------------------------------------------------------------------------
# DPC-kNN, counted analytically


def _is_dpc_knn(module: nn.Module) -> bool:
 (token_clustering.TRACE_PLAN). A GPU runs more"""DPC-kNN reducers (also the ``DPCKNN`` token reducer, a subclass)."""
 (token_clustering.TRACE_PLAN). A GPU runs morefrom ..models.layers.token_clustering import DPCKNNClustering
 (token_clustering.TRACE_PLAN). A GPU runs morereturn isinstance(module, DPCKNNClustering)


def dpc_knn_flops(reducer: nn.Module, batch: int, channels: int,
 (token_clustering.TRACE_PLAN). A GPU runs more              hw: Tuple[int, int]) -> Counter:
 (token_clustering.TRACE_PLAN). A GPU runs more"""FLOPs of one DPC-kNN reducer call (see the module docstring).

 (token_clustering.TRACE_PLAN). A GPU runs moreArgs:
 (token_clustering.TRACE_PLAN). A GPU runs more    reducer: A :class:`DPCKNNClustering` (its ``window_size``,
 (token_clustering.TRACE_PLAN). A GPU runs more        ``sr_ratio``, ``scale_factors`` and ``k`` are read).
 (token_clustering.TRACE_PLAN). A GPU runs more    batch, channels: B and C of the (B, H*W, C) tokens.
 (token_clustering.TRACE_PLAN). A GPU runs more    hw: (H, W) of the token grid.

 (token_clustering.TRACE_PLAN). A GPU runs moreReturns:
 (token_clustering.TRACE_PLAN). A GPU runs more    Counter with ``clustering.distances``, ``clustering.selection`` and
 (token_clustering.TRACE_PLAN). A GPU runs more    ``clustering.merge``.
 (token_clustering.TRACE_PLAN). A GPU runs more"""
 (token_clustering.TRACE_PLAN). A GPU runs morefrom ..models.layers.window_layout import WindowLayout
 (token_clustering.TRACE_PLAN). A GPU runs moreh, w = int(hw[0]), int(hw[1])
 (token_clustering.TRACE_PLAN). A GPU runs morelayout = WindowLayout((h, w), reducer.window_size, reducer.sr_ratio,
 (token_clustering.TRACE_PLAN). A GPU runs more                      reducer.scale_factors)
 (token_clustering.TRACE_PLAN). A GPU runs moretodo = [s for s, ident in enumerate(layout.identity) if not ident]
 (token_clustering.TRACE_PLAN). A GPU runs moreout = Counter(dict.fromkeys(CLUSTERING_OPS, 0))
 (token_clustering.TRACE_PLAN). A GPU runs moreif not todo:
 (token_clustering.TRACE_PLAN). A GPU runs more    return out
 (token_clustering.TRACE_PLAN). A GPU runs morec, k = channels, reducer.k
 (token_clustering.TRACE_PLAN). A GPU runs more# The algorithm's work, window by window: what a jit trace runs
 (token_clustering.TRACE_PLAN). A GPU runs more# (token_clustering.TRACE_PLAN). A GPU runs more where it pads border
 (token_clustering.TRACE_PLAN). A GPU runs more# windows, a CPU where it recomputes distances to denser tokens.
 (token_clustering.TRACE_PLAN). A GPU runs morefor i, n in enumerate(layout.tokens):
 (token_clustering.TRACE_PLAN). A GPU runs more    counts = [layout.counts[s][i] for s in todo]
 (token_clustering.TRACE_PLAN). A GPU runs more    if all(cnt == n for cnt in counts):
 (token_clustering.TRACE_PLAN). A GPU runs more        continue  # every clustered scale is the identity here
 (token_clustering.TRACE_PLAN). A GPU runs more    big_k = max(counts)
 (token_clustering.TRACE_PLAN). A GPU runs more    out['clustering.distances'] += batch * (n * n + n * big_k) * (c + 2)
 (token_clustering.TRACE_PLAN). A GPU runs more    out['clustering.selection'] += batch * (2 * n * n + n * min(k, n) +
 (token_clustering.TRACE_PLAN). A GPU runs more                                            2 * n + n * sum(counts))
 (token_clustering.TRACE_PLAN). A GPU runs moreout['clustering.merge'] += len(todo) * batch * h * w * (c + 1)
 (token_clustering.TRACE_PLAN). A GPU runs morereturn out


# --------------------------------------------------------------------------
# Tracing helpers


def _int_sizes(module, args, kwargs):
 (token_clustering.TRACE_PLAN). A GPU runs more"""Forward pre-hook: (H, W) tuples traced as 0-dim tensors -> ints.

 (token_clustering.TRACE_PLAN). A GPU runs moreUnder ``torch.jit.trace`` ``x.shape[i]`` is a 0-dim tensor, which Python
 (token_clustering.TRACE_PLAN). A GPU runs morecode that computes window layouts from ``hw`` cannot use. The trace is
 (token_clustering.TRACE_PLAN). A GPU runs moreonly used for counting, so freezing the sizes is harmless.
 (token_clustering.TRACE_PLAN). A GPU runs more"""
 (token_clustering.TRACE_PLAN). A GPU runs moreif not torch.jit.is_tracing():
 (token_clustering.TRACE_PLAN). A GPU runs more    return None

 (token_clustering.TRACE_PLAN). A GPU runs moredef fix(a):
 (token_clustering.TRACE_PLAN). A GPU runs more    if (isinstance(a, (tuple, list)) and a
 (token_clustering.TRACE_PLAN). A GPU runs more            and all(isinstance(t, torch.Tensor) and t.dim() == 0
 (token_clustering.TRACE_PLAN). A GPU runs more                    and not t.is_floating_point() for t in a)):
 (token_clustering.TRACE_PLAN). A GPU runs more        return type(a)(int(t) for t in a)
 (token_clustering.TRACE_PLAN). A GPU runs more    return a

 (token_clustering.TRACE_PLAN). A GPU runs morereturn (tuple(fix(a) for a in args),
 (token_clustering.TRACE_PLAN). A GPU runs more        {k: fix(v) for k, v in kwargs.items()})


def _grid_arg(args, kwargs):
 (token_clustering.TRACE_PLAN). A GPU runs more"""The (H, W) argument of a reducer call: ``hw=`` or the first tuple."""
 (token_clustering.TRACE_PLAN). A GPU runs moreif 'hw' in kwargs:
 (token_clustering.TRACE_PLAN). A GPU runs more    return kwargs['hw']
 (token_clustering.TRACE_PLAN). A GPU runs morefor a in args[1:]:
 (token_clustering.TRACE_PLAN). A GPU runs more    if isinstance(a, (tuple, list)) and len(a) == 2:
 (token_clustering.TRACE_PLAN). A GPU runs more        return a
 (token_clustering.TRACE_PLAN). A GPU runs moreraise ValueError('cannot find the (H, W) argument of a DPC-kNN call')


@contextmanager
def _counting_hooks(model: nn.Module, calls: List[tuple]):
 (token_clustering.TRACE_PLAN). A GPU runs more"""Install the size pre-hooks and the DPC-kNN recorders for one trace."""
 (token_clustering.TRACE_PLAN). A GPU runs morenames = {id(m): n for n, m in model.named_modules()}
 (token_clustering.TRACE_PLAN). A GPU runs morehandles = []

 (token_clustering.TRACE_PLAN). A GPU runs moredef record(module, args, kwargs, output):
 (token_clustering.TRACE_PLAN). A GPU runs more    x = kwargs['x'] if 'x' in kwargs else args[0]
 (token_clustering.TRACE_PLAN). A GPU runs more    b, _, c = (int(s) for s in x.shape)
 (token_clustering.TRACE_PLAN). A GPU runs more    hw = tuple(int(s) for s in _grid_arg(args, kwargs))
 (token_clustering.TRACE_PLAN). A GPU runs more    calls.append((names[id(module)], module, b, c, hw))

 (token_clustering.TRACE_PLAN). A GPU runs moretry:
 (token_clustering.TRACE_PLAN). A GPU runs more    for m in model.modules():
 (token_clustering.TRACE_PLAN). A GPU runs more        handles.append(
 (token_clustering.TRACE_PLAN). A GPU runs more            m.register_forward_pre_hook(_int_sizes, with_kwargs=True))
 (token_clustering.TRACE_PLAN). A GPU runs more        if _is_dpc_knn(m):
 (token_clustering.TRACE_PLAN). A GPU runs more            handles.append(
 (token_clustering.TRACE_PLAN). A GPU runs more                m.register_forward_hook(record, with_kwargs=True))
 (token_clustering.TRACE_PLAN). A GPU runs more    yield
 (token_clustering.TRACE_PLAN). A GPU runs morefinally:
 (token_clustering.TRACE_PLAN). A GPU runs more    for h in handles:
 (token_clustering.TRACE_PLAN). A GPU runs more        h.remove()


# --------------------------------------------------------------------------
# Sorting counts into parts of the model

KINDS = ('embedding', 'attention projections', 'attention products',
 (token_clustering.TRACE_PLAN). A GPU runs more     'clustering', 'mlp', 'other')
_KIND_BY_NAME = {
 (token_clustering.TRACE_PLAN). A GPU runs more'clustering': 'clustering', 'cluster': 'clustering',
 (token_clustering.TRACE_PLAN). A GPU runs more'cluster_norm': 'clustering', 'weight_layer': 'clustering',
 (token_clustering.TRACE_PLAN). A GPU runs more'teacher': 'clustering',
 (token_clustering.TRACE_PLAN). A GPU runs more'attn': 'attention projections', 'attention': 'attention projections',
 (token_clustering.TRACE_PLAN). A GPU runs more'self_attn': 'attention projections',
 (token_clustering.TRACE_PLAN). A GPU runs more'mlp': 'mlp', 'ffn': 'mlp', 'ffns': 'mlp',
 (token_clustering.TRACE_PLAN). A GPU runs more'patch_embed': 'embedding', 'patch_embeds': 'embedding',
 (token_clustering.TRACE_PLAN). A GPU runs more'stem': 'embedding', 'downsample': 'embedding',
 (token_clustering.TRACE_PLAN). A GPU runs more'downsamples': 'embedding',
}


def _kind(path: List[str], modules: Dict[str, nn.Module], op: str) -> str:
 (token_clustering.TRACE_PLAN). A GPU runs more"""Kind of an operator run directly by the module at ``path``."""
 (token_clustering.TRACE_PLAN). A GPU runs moreif op in CLUSTERING_OPS:
 (token_clustering.TRACE_PLAN). A GPU runs more    return 'clustering'
 (token_clustering.TRACE_PLAN). A GPU runs morefor depth in range(len(path), 0, -1):
 (token_clustering.TRACE_PLAN). A GPU runs more    kind = _KIND_BY_NAME.get(path[depth - 1])
 (token_clustering.TRACE_PLAN). A GPU runs more    if kind is None:
 (token_clustering.TRACE_PLAN). A GPU runs more        continue
 (token_clustering.TRACE_PLAN). A GPU runs more    if kind == 'attention projections' and op in ATTENTION_PRODUCT_OPS:
 (token_clustering.TRACE_PLAN). A GPU runs more        owner = modules.get('.'.join(path))
 (token_clustering.TRACE_PLAN). A GPU runs more        if op == 'bmm' and getattr(owner, 'num_clusters', 0):
 (token_clustering.TRACE_PLAN). A GPU runs more            return 'clustering'  # PaCa: assignment @ tokens
 (token_clustering.TRACE_PLAN). A GPU runs more        return 'attention products'
 (token_clustering.TRACE_PLAN). A GPU runs more    return kind
 (token_clustering.TRACE_PLAN). A GPU runs morereturn 'other'


@dataclass
class FlopReport:
 (token_clustering.TRACE_PLAN). A GPU runs more"""Result of :func:`analyze_flops`; all counts in FLOPs (= MACs)."""
 (token_clustering.TRACE_PLAN). A GPU runs moretotal: int
 (token_clustering.TRACE_PLAN). A GPU runs moreby_operator: Counter
 (token_clustering.TRACE_PLAN). A GPU runs moreby_part: 'OrderedDict[str, int]'
 (token_clustering.TRACE_PLAN). A GPU runs moreby_module: Dict[str, Counter] = field(repr=False)
 (token_clustering.TRACE_PLAN). A GPU runs moreuncounted_ops: Counter = field(default_factory=Counter)

 (token_clustering.TRACE_PLAN). A GPU runs moredef part(self, *prefixes: str) -> int:
 (token_clustering.TRACE_PLAN). A GPU runs more    return sum(v for k, v in self.by_part.items()
 (token_clustering.TRACE_PLAN). A GPU runs more               if k.startswith(prefixes))

 (token_clustering.TRACE_PLAN). A GPU runs moredef kind(self, kind: str) -> int:
 (token_clustering.TRACE_PLAN). A GPU runs more    """One kind summed over all parts, e.g. ``'clustering'``."""
 (token_clustering.TRACE_PLAN). A GPU runs more    return sum(v for k, v in self.by_part.items()
 (token_clustering.TRACE_PLAN). A GPU runs more               if k.split('/')[-1] == kind)

 (token_clustering.TRACE_PLAN). A GPU runs more@property
 (token_clustering.TRACE_PLAN). A GPU runs moredef without_attention_and_clustering(self) -> int:
 (token_clustering.TRACE_PLAN). A GPU runs more    """The count without attention products and clustering: the
 (token_clustering.TRACE_PLAN). A GPU runs more    convention of the ClusTR paper's FLOP figures."""
 (token_clustering.TRACE_PLAN). A GPU runs more    return (self.total - self.kind('attention products') -
 (token_clustering.TRACE_PLAN). A GPU runs more            self.kind('clustering'))


def _part_of(name: str, has_backbone: bool) -> Tuple[str, List[str]]:
 (token_clustering.TRACE_PLAN). A GPU runs morepath = name.split('.') if name else []
 (token_clustering.TRACE_PLAN). A GPU runs moreif not has_backbone:
 (token_clustering.TRACE_PLAN). A GPU runs more    return 'backbone', path
 (token_clustering.TRACE_PLAN). A GPU runs moreif not path:
 (token_clustering.TRACE_PLAN). A GPU runs more    return 'other', path
 (token_clustering.TRACE_PLAN). A GPU runs moreif path[0] == 'backbone':
 (token_clustering.TRACE_PLAN). A GPU runs more    return 'backbone', path
 (token_clustering.TRACE_PLAN). A GPU runs moreif path[0].startswith('neck'):
 (token_clustering.TRACE_PLAN). A GPU runs more    return 'neck', path
 (token_clustering.TRACE_PLAN). A GPU runs morereturn 'heads', path


def analyze_flops(model: nn.Module,
 (token_clustering.TRACE_PLAN). A GPU runs more              inputs: Union[torch.Tensor, Tuple],
 (token_clustering.TRACE_PLAN). A GPU runs more              forward: Optional[Callable] = None) -> FlopReport:
 (token_clustering.TRACE_PLAN). A GPU runs more"""Count the FLOPs of one forward of ``model`` (no grad, current mode).

 (token_clustering.TRACE_PLAN). A GPU runs moreArgs:
 (token_clustering.TRACE_PLAN). A GPU runs more    model: The module to trace. Module names in the report are relative
 (token_clustering.TRACE_PLAN). A GPU runs more        to it; when it has a ``backbone`` child, the counts are split into
 (token_clustering.TRACE_PLAN). A GPU runs more        backbone (by kind), neck and heads.
 (token_clustering.TRACE_PLAN). A GPU runs more    inputs: Positional inputs of the traced call.
 (token_clustering.TRACE_PLAN). A GPU runs more    forward: Optional replacement of ``model.forward`` for the trace
 (token_clustering.TRACE_PLAN). A GPU runs more        (e.g. a detector's tensor path); restored afterwards.
 (token_clustering.TRACE_PLAN). A GPU runs more"""
 (token_clustering.TRACE_PLAN). A GPU runs moreinputs = inputs if isinstance(inputs, tuple) else (inputs, )
 (token_clustering.TRACE_PLAN). A GPU runs morecalls: List[tuple] = []
 (token_clustering.TRACE_PLAN). A GPU runs moresaved = model.__dict__.get('forward')
 (token_clustering.TRACE_PLAN). A GPU runs moreif forward is not None:
 (token_clustering.TRACE_PLAN). A GPU runs more    model.forward = forward
 (token_clustering.TRACE_PLAN). A GPU runs moretry:
 (token_clustering.TRACE_PLAN). A GPU runs more    with _counting_hooks(model, calls), torch.no_grad():
 (token_clustering.TRACE_PLAN). A GPU runs more        analyzer = flop_analyzer(model, inputs)
 (token_clustering.TRACE_PLAN). A GPU runs more        per_module = {k: Counter(v) for k, v in
 (token_clustering.TRACE_PLAN). A GPU runs more                      analyzer.by_module_and_operator().items()}
 (token_clustering.TRACE_PLAN). A GPU runs more        uncounted = Counter(analyzer.unsupported_ops())
 (token_clustering.TRACE_PLAN). A GPU runs more        for name, *_ in calls:  # ops inside DPC-kNN: counted analytically
 (token_clustering.TRACE_PLAN). A GPU runs more            uncounted.subtract(analyzer.unsupported_ops(name))
 (token_clustering.TRACE_PLAN). A GPU runs more        uncounted = +uncounted
 (token_clustering.TRACE_PLAN). A GPU runs morefinally:
 (token_clustering.TRACE_PLAN). A GPU runs more    if forward is not None:
 (token_clustering.TRACE_PLAN). A GPU runs more        if saved is None:
 (token_clustering.TRACE_PLAN). A GPU runs more            del model.forward
 (token_clustering.TRACE_PLAN). A GPU runs more        else:
 (token_clustering.TRACE_PLAN). A GPU runs more            model.forward = saved

 (token_clustering.TRACE_PLAN). A GPU runs more# Replace the traced count of every DPC-kNN call by the analytic one.
 (token_clustering.TRACE_PLAN). A GPU runs morereducers = {name for name, *_ in calls}
 (token_clustering.TRACE_PLAN). A GPU runs moreanalytic: Dict[str, Counter] = {name: Counter() for name in reducers}
 (token_clustering.TRACE_PLAN). A GPU runs morefor name, module, b, c, hw in calls:
 (token_clustering.TRACE_PLAN). A GPU runs more    analytic[name].update(dpc_knn_flops(module, b, c, hw))
 (token_clustering.TRACE_PLAN). A GPU runs morefor name in reducers:
 (token_clustering.TRACE_PLAN). A GPU runs more    delta = Counter(analytic[name])
 (token_clustering.TRACE_PLAN). A GPU runs more    delta.subtract(per_module.get(name, Counter()))
 (token_clustering.TRACE_PLAN). A GPU runs more    parts = name.split('.')
 (token_clustering.TRACE_PLAN). A GPU runs more    for i in range(len(parts) + 1):
 (token_clustering.TRACE_PLAN). A GPU runs more        anc = '.'.join(parts[:i])
 (token_clustering.TRACE_PLAN). A GPU runs more        if anc in per_module:
 (token_clustering.TRACE_PLAN). A GPU runs more            per_module[anc].update(delta)
 (token_clustering.TRACE_PLAN). A GPU runs more            per_module[anc] = +per_module[anc]  # drop zeros
 (token_clustering.TRACE_PLAN). A GPU runs more    for sub in list(per_module):
 (token_clustering.TRACE_PLAN). A GPU runs more        if sub.startswith(name + '.'):
 (token_clustering.TRACE_PLAN). A GPU runs more            per_module[sub] = Counter()

 (token_clustering.TRACE_PLAN). A GPU runs more# Exclusive counts per module -> (part, kind).
 (token_clustering.TRACE_PLAN). A GPU runs moremodules = dict(model.named_modules())
 (token_clustering.TRACE_PLAN). A GPU runs morehas_backbone = 'backbone' in modules
 (token_clustering.TRACE_PLAN). A GPU runs morechildren: Dict[str, List[str]] = {}
 (token_clustering.TRACE_PLAN). A GPU runs morefor name in per_module:
 (token_clustering.TRACE_PLAN). A GPU runs more    if name:
 (token_clustering.TRACE_PLAN). A GPU runs more        parent = name.rsplit('.', 1)[0] if '.' in name else ''
 (token_clustering.TRACE_PLAN). A GPU runs more        children.setdefault(parent, []).append(name)
 (token_clustering.TRACE_PLAN). A GPU runs moreby_part: Dict[str, int] = Counter()
 (token_clustering.TRACE_PLAN). A GPU runs morefor name, counts in per_module.items():
 (token_clustering.TRACE_PLAN). A GPU runs more    own = Counter(counts)
 (token_clustering.TRACE_PLAN). A GPU runs more    for child in children.get(name, ()):
 (token_clustering.TRACE_PLAN). A GPU runs more        own.subtract(per_module[child])
 (token_clustering.TRACE_PLAN). A GPU runs more    part, path = _part_of(name, has_backbone)
 (token_clustering.TRACE_PLAN). A GPU runs more    for op, value in own.items():
 (token_clustering.TRACE_PLAN). A GPU runs more        if not value:
 (token_clustering.TRACE_PLAN). A GPU runs more            continue
 (token_clustering.TRACE_PLAN). A GPU runs more        key = (f'{part}/{_kind(path, modules, op)}'
 (token_clustering.TRACE_PLAN). A GPU runs more               if part == 'backbone' else part)
 (token_clustering.TRACE_PLAN). A GPU runs more        by_part[key] += value
 (token_clustering.TRACE_PLAN). A GPU runs moreorder = [f'backbone/{k}' for k in KINDS] + ['neck', 'heads', 'other']
 (token_clustering.TRACE_PLAN). A GPU runs moreordered = OrderedDict((k, by_part[k]) for k in order if by_part.get(k))
 (token_clustering.TRACE_PLAN). A GPU runs moretotal_ops = +per_module.get('', Counter())
 (token_clustering.TRACE_PLAN). A GPU runs morereturn FlopReport(
 (token_clustering.TRACE_PLAN). A GPU runs more    total=sum(total_ops.values()), by_operator=total_ops,
 (token_clustering.TRACE_PLAN). A GPU runs more    by_part=ordered, by_module=per_module, uncounted_ops=uncounted)


def count_flops(model: nn.Module, shape: Sequence[int]) -> Counter:
 (token_clustering.TRACE_PLAN). A GPU runs more"""FLOPs of one ``model(x)`` with ``x`` of ``shape``, by operator."""
 (token_clustering.TRACE_PLAN). A GPU runs morewas_training = model.training
 (token_clustering.TRACE_PLAN). A GPU runs moremodel.eval()
 (token_clustering.TRACE_PLAN). A GPU runs moretry:
 (token_clustering.TRACE_PLAN). A GPU runs more    gen = torch.Generator().manual_seed(0)
 (token_clustering.TRACE_PLAN). A GPU runs more    x = torch.rand(*shape, generator=gen)
 (token_clustering.TRACE_PLAN). A GPU runs more    return analyze_flops(model, x).by_operator
 (token_clustering.TRACE_PLAN). A GPU runs morefinally:
 (token_clustering.TRACE_PLAN). A GPU runs more    model.train(was_training)

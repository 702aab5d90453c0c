"""ClusTR's key/value reducer: DPC-kNN clusters of the tokens, merged with
the tokens' learned weights.

The paper's three ideas are the steps of :meth:`DPCKNN.forward`:

1. ``self.layout(hw, device)``: the grid cut into clustering windows and
   each window's cluster counts (a ``WindowLayout`` of the op,
   :mod:`clustr_mm.ops.dpc_knn`, built once per size), with the backend the
   dispatch chose for the device;
2. ``assign_clusters`` (the op's dispatch): density-peak centers, each
   token to its nearest center (the backends; ``dpc_knn_reference`` in
   ``clustr_mm/ops/dpc_knn/reference.py`` is the algorithm step by step);
3. the merge: the ``w``-weighted mean of each cluster's members.

Steps 2 and 3 are ``cluster_and_merge`` of ``clustr_mm/ops/dpc_knn/merge.py``
(one op on the CUDA path; :func:`merge_clusters` is step 3 alone, for ids
found elsewhere).

The algorithm follows the official code (``shared/reference/clustr.md`` of
the project's notes) with three deliberate differences: ties are broken by
token index instead of random noise (deterministic; identical tokens are
exactly 0 apart whatever the batch, see the op's ``reference.py``), it
always runs in fp32 without gradient, and the distance block is bounded.
Every shape follows from the input size alone: no host synchronisation,
and ``torch.compile`` / CUDA graphs / ``torch.jit.trace`` can capture it.

Clustering runs inside *windows* of the stage's token grid. Exact mode
(``window_size=None``) is one window = the whole grid, i.e. the official
per-image DPC-kNN. Window mode tiles the grid with ``min(s, H) x min(s, W)``
windows from the top-left; cluster tokens of all windows are concatenated
(row-major over windows), so keys/values stay global.

Cluster counts: a window of ``n`` tokens gets ``m = max(1, n // sr_ratio**2)``
clusters for the coarse scale and ``min(4 * m, n)`` for the fine one
(``scale_factors=CLUSTR_SCALES``, (1, 4)). A full default window thus gets
the ImageNet counts of its stage (49 and 196 with 56 x 56 tokens at stride
4); a border window of e.g. 56 x 16 tokens at stride 4 gets 14 and 56.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import nn

from ...graph_safety import is_tracing
from ...ops.dpc_knn.common import (CLUSTR_SCALES, ClusteringPlan, ClusterIds,
                                   Task, WindowLayout, cluster_counts,
                                   window_tokens)
from ...ops.dpc_knn.dispatch import Choice, batch_consts, choose_backend
from ...ops.dpc_knn.merge import (cluster_and_merge, layout_for, merge_torch,
                                  split_scales)
from ...ops.dpc_knn.reference import DEFAULT_PRECISION, check_precision
from ...registry import register_model
from .arg_checks import check_dpc_knn_args
from .token_reducer import Grid, Reduction, TokenReducer


def merge_clusters(x: torch.Tensor, w: Optional[torch.Tensor],
                   ids: ClusterIds, layout: WindowLayout,
                   dtype: Optional[torch.dtype] = None) -> List[torch.Tensor]:
    """Per scale, the w-weighted mean of each cluster's members
    (normaliser + 1e-6): (B, totals[s], C), differentiable w.r.t. ``x``
    and ``w`` (what :meth:`DPCKNN.forward` computes with the clustering,
    :func:`~clustr_mm.ops.dpc_knn.merge.cluster_and_merge`, for ids
    found elsewhere).

    Args:
        x: (B, N, C) tokens; w: (B, N, 1) positive token weights, or None
            (the plain mean); both used in fp32 (without autocast).
        ids: The tokens' clusters (the op's ``assign_clusters``).
        layout: The layout ``ids`` were assigned under.
        dtype: Of the result; None: ``x``'s.

    An identity scale (every token its own cluster, e.g. the fine scale of
    stage 3 at 224x224) gets the tokens scaled by ``w / (w + 1e-6)``, which
    is what the merge gives for singleton clusters.
    """
    b, n, c = x.shape
    dtype = dtype or x.dtype
    with torch.autocast(x.device.type, enabled=False):
        x = x.float()
        w = None if w is None else w.float()
        if b:
            merged = merge_torch(x, w, False, ids.clustered,
                                 batch_consts(layout, b, c))[1]
        else:  # empty batch (a size, not data: no sync)
            merged = x.new_zeros(0, c)
    return split_scales(merged.to(dtype), layout, b)


def summary_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype of the cluster tokens of ``x``: under autocast, fp32 tokens
    give autocast's dtype (what their key/value projections compute in, so
    the cast happens once for every scale, not once per projection);
    otherwise ``x``'s."""
    device = x.device.type
    if x.dtype != torch.float32:
        return x.dtype
    if hasattr(torch, 'get_autocast_dtype'):  # torch >= 2.4
        if torch.is_autocast_enabled(device):
            return torch.get_autocast_dtype(device)
    elif device == 'cpu' and torch.is_autocast_cpu_enabled():
        return torch.get_autocast_cpu_dtype()
    elif device == 'cuda' and torch.is_autocast_enabled():
        return torch.get_autocast_gpu_dtype()
    return x.dtype


@register_model
class DPCKNN(TokenReducer):
    """ClusTR's reducer: DPC-kNN clusters, w-weighted mean of the members.

    Has no parameters. The clustering runs without gradient in fp32;
    gradients reach the summary through the merge (tokens and weights).
    Without ``weights`` the merge is the plain mean.

    Args:
        sr_ratio (int): Reduction ratio r; coarse count ``n // r**2`` per
            window of n tokens.
        scale_factors (Sequence[int]): Count multiplier per scale;
            ``CLUSTR_SCALES`` (1, 4) is ClusTR's two nested scales, (1, )
            its single-scale ablation.
        k (int): Neighbours of the kNN density (the token itself included).
            Default 5.
        window_size (int, optional): Clustering window side in tokens; None
            is exact mode (one window per image, the official algorithm).
        max_chunk_elems (int, optional): Largest distance chunk, in
            elements; bounds the clustering's memory. Default None: the
            plan's (2**20 on the CPU, 2**28 elsewhere).
        plan (ClusteringPlan, optional): Backend and layout; None: the
            dispatch's choice for the device (:meth:`backend`). Also an
            attribute (:func:`use_plan`), e.g. for the op census to count
            the CUDA path on a CPU.
        precision (str, optional): The fused kernels' distance products:
            'tf32x3' (3xTF32 on tensor cores with a wider tie threshold:
            ids change about as often as reordering fp32 sums changes them;
            docs/backbones.md) or 'ieee' (fp32 FMA products, bit for bit
            the same on every run). None: the ``plan``'s if one is given,
            else 'tf32x3'. Goes into the plan (a ``plan`` given here must
            agree with it); the reference and blocked backends are IEEE
            fp32 and ignore it.

    Traced graphs (``torch.onnx.export``, ``torch.jit.trace``) take the
    batch from the input, but the windows and cluster counts of the traced
    grid size are constants in them (Python ints of the layout): a true
    :attr:`graph_static_hw` tells exporters so
    (``tools/deployment/pytorch2onnx.py`` keeps height and width fixed dims
    of the graph's input, and ONNX Runtime refuses other sizes instead of
    computing wrong outputs).
    """
    uses_token_weights = True
    takes_log_weights = True
    fp32 = True
    graph_static_hw = True

    def __init__(self, sr_ratio: int,
                 scale_factors: Sequence[int] = CLUSTR_SCALES, k: int = 5,
                 window_size: Optional[int] = None,
                 max_chunk_elems: Optional[int] = None,
                 plan: Optional[ClusteringPlan] = None,
                 precision: Optional[str] = None):
        super().__init__()
        check_dpc_knn_args(sr_ratio, scale_factors, k, window_size,
                           max_chunk_elems)
        self.sr_ratio = sr_ratio
        self.scale_factors = tuple(scale_factors)
        self.k = k
        self.window_size = window_size
        self.max_chunk_elems = max_chunk_elems
        self.plan = plan
        if precision is None:
            precision = DEFAULT_PRECISION if plan is None else plan.precision
        self.precision = check_precision(precision)
        if plan is not None and plan.precision != self.precision:
            # the reducer's precision goes into whatever plan runs: a
            # different one in the plan would be silently replaced
            raise ValueError(
                f'plan.precision {plan.precision!r} and precision '
                f'{precision!r} disagree: set the precision with the '
                'precision argument')
        self._layout = None  # (key, WindowLayout) of the last grid seen

    @property
    def num_scales(self) -> int:
        return len(self.scale_factors)

    def num_tokens(self, hw: Grid) -> List[int]:
        tokens = window_tokens((int(hw[0]), int(hw[1])), self.window_size)
        return [sum(c) for c in cluster_counts(tokens, self.sr_ratio,
                                               self.scale_factors)]

    def backend(self, device: Optional[torch.device]) -> Choice:
        """Which backend clusters on ``device`` (fp32 tokens, this
        reducer's k and scales), with the plan it runs and why each faster
        backend was not taken (:func:`choose_backend`)."""
        task = Task(device, torch.float32, self.k, self.num_scales)
        choice = choose_backend(task, self.plan)
        return choice._replace(plan=choice.plan._replace(
            precision=self.precision, max_chunk_elems=(
                self.max_chunk_elems or choice.plan.max_chunk_elems)))

    def layout(self, hw: Tuple[int, int],
               device: torch.device) -> WindowLayout:
        """The ``WindowLayout`` of an ``hw`` grid under the plan of
        :meth:`backend`, built once per size and shared by the reducers of
        the same sizes (rebuilt, not cached, while tracing or
        compiling)."""
        grid, plan = (int(hw[0]), int(hw[1])), self.backend(device).plan
        if is_tracing():
            return WindowLayout(grid, self.window_size, self.sr_ratio,
                                self.scale_factors, device, self.k,
                                plan=plan)
        key = (grid, device, plan)
        if self._layout is None or self._layout[0] != key:
            self._layout = (key, layout_for(
                grid, self.window_size, self.sr_ratio, self.scale_factors,
                self.k, torch.device(device), plan))
        return self._layout[1]

    def forward(self, x: torch.Tensor, hw: Grid,
                weights: Optional[torch.Tensor] = None, *,
                log_weights: Optional[torch.Tensor] = None) -> Reduction:
        """x: (B, N, C) tokens of the ``hw`` grid, weights: (B, N, 1) or
        None (all 1), or their logs as ``log_weights`` (the attention's
        ``weight_layer`` output: the ``exp`` then runs in the clustering
        op) -> per scale the cluster tokens (B, M_s, C) and the tokens'
        cluster ids (B, N). The cluster tokens come in ``x``'s dtype, or
        under autocast, for fp32 ``x``, in autocast's."""
        if weights is not None and log_weights is not None:
            raise ValueError('DPCKNN takes weights or log_weights, not both')
        dtype = summary_dtype(x)
        b = x.shape[0]
        with torch.autocast(x.device.type, enabled=False):
            x = x.float()  # the clustering and the merge run in fp32
            w = weights if log_weights is None else log_weights
            layout = self.layout(hw, x.device)
            ids, merged = cluster_and_merge(
                x, None if w is None else w.float(), layout,
                log_weights is not None)
        # one cast for every scale (under autocast), then the scales' views
        return Reduction(split_scales(merged.to(dtype), layout, b),
                         ids.scales)

    def extra_repr(self) -> str:
        mode = ('exact' if self.window_size is None else
                f'window {self.window_size}')
        return (f'sr_ratio={self.sr_ratio}, scales={self.scale_factors}, '
                f'k={self.k}, {mode}, {self.precision}')


def use_plan(model: nn.Module, plan: Optional[ClusteringPlan]) -> None:
    """Set the ``ClusteringPlan`` of every DPC-kNN reducer in ``model``
    (None: back to the dispatch's choice); e.g. the op census
    counts the CUDA path (``FUSED_PLAN``) on a CPU."""
    for m in model.modules():
        if isinstance(m, DPCKNN):
            m.plan = plan

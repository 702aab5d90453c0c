"""DPC-kNN token clustering (ClusTR's key/value reducer) and weighted merge.

:func:`dpc_knn_assign` is the clustering entry point: tokens of a grid ->
cluster ids per scale. It cuts the grid into windows
(:class:`~.window_layout.WindowLayout`, built once per size) and hands each
group of same-shaped windows to one implementation, chosen by the layout's
:class:`~.window_layout.ClusteringPlan` (from the device and what is
installed, or given explicitly):

* ``'reference'`` (:func:`~.dpc_knn.dpc_knn_reference`): the paper's five
  steps over whole distance blocks; what ``torch.jit.trace`` records;
* ``'blocked'`` (:func:`~.dpc_knn_blocked.dpc_knn_blocked`): bounded blocks,
  CPUs and GPUs without Triton;
* ``'fused'`` (:mod:`~.dpc_knn_fused`): one custom op, Triton kernels on CUDA
  that keep distance tiles on chip.

All give the same clusters. The algorithm follows the official code (see
``shared/reference/clustr.md``) with three deliberate differences: ties are
broken by token index instead of random noise (deterministic; identical
tokens are exactly 0 apart whatever the batch, see :mod:`~.dpc_knn`), it
always runs in fp32 without gradient, and the distance block is bounded.
Every shape follows from the input size alone: no host synchronisation, and
``torch.compile`` / CUDA graphs / ``torch.jit.trace`` can capture it.

Clustering runs inside *windows* of the stage's token grid. Exact mode
(``window_size=None``) is one window = the whole grid, i.e. the official
per-image DPC-kNN. Window mode tiles the grid with ``min(s, H) x min(s, W)``
windows from the top-left; cluster tokens of all windows are concatenated
(row-major over windows), so keys/values stay global.

Cluster counts: a window of ``n`` tokens gets ``m = max(1, n // sr_ratio**2)``
clusters for the coarse scale and ``min(4 * m, n)`` for the fine one
(``scale_factors=(1, 4)``). A full default window thus gets the ImageNet
counts of its stage (49 and 196 with 56 x 56 tokens at stride 4); a border
window of e.g. 56 x 16 tokens at stride 4 gets 14 and 56.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .dpc_knn import check_precision, dpc_knn_reference
from .dpc_knn_blocked import _cat, _k_smallest, dpc_knn_blocked  # noqa: F401
from .graph_safety import is_tracing
from .window_layout import (ClusteringPlan, WindowBatch, WindowLayout,
                            merge_rows, plan_for)


def _cluster_windows(x: torch.Tensor, counts: Sequence[int], k: int,
                     consts: WindowBatch, plan: ClusteringPlan,
                     budget: int) -> torch.Tensor:
    """(S, G, n) ids of G windows by the plan's implementation."""
    if plan.kernel == 'fused':
        from .dpc_knn_fused import dpc_knn_fused
        return dpc_knn_fused(x, counts, k, consts, plan.precision)
    if plan.kernel == 'reference':
        return dpc_knn_reference(x, counts, k, consts)
    return dpc_knn_blocked(x, counts, k, consts, budget, plan.blocked_knn)


@torch.no_grad()
def _assign_stacked(x: torch.Tensor, layout: WindowLayout, k: int,
                    max_chunk_elems: Optional[int]) -> torch.Tensor:
    """(S', B, N) ids of the non-identity scales (see :func:`dpc_knn_assign`)."""
    b, n_tok, c = x.shape
    h, w = layout.hw
    budget = max_chunk_elems or layout.plan.max_chunk_elems
    todo = layout.clustered
    consts = layout.window_batch(b, c)
    with torch.autocast(x.device.type, enabled=False):
        grid = x.float().reshape(b, h, w, c)
        outs = []
        for grp, group_consts in zip(layout.groups, consts.groups):
            (r0, r1), (c0, c1) = grp.rows, grp.cols
            (sh, sw), (gh, gw), (ph, pw) = grp.window, grp.grid, grp.pad
            part = grid[:, r0:r1, c0:c1]
            if ph or pw:
                part = F.pad(part, (0, 0, 0, pw, 0, ph))
            n = sh * sw
            win = part.reshape(b, gh, sh, gw, sw, c).transpose(2, 3).reshape(
                -1, n, c)
            counts = [grp.counts[s] for s in todo]
            # Whole windows per call, as many as fit the block budget (the
            # fused kernel keeps no block: all in one call).
            per_call = (win.shape[0] if layout.plan.kernel == 'fused' else
                        max(1, budget // (n * n)))
            parts = []
            for g0 in range(0, win.shape[0], per_call):
                sl = (slice(0, None) if per_call >= win.shape[0] else
                      slice(g0, g0 + per_call))
                parts.append(_cluster_windows(
                    win[sl], counts, k, group_consts.windows(sl),
                    layout.plan, budget))
            local = _cat(parts, 1)
            if layout.token_pos is None:
                return local.view(len(todo), b, n_tok)
            outs.append((local.view(len(todo), b, gh * gw, n) +
                         group_consts.offsets).flatten(2))
        return _cat(outs, 2).index_select(2, layout.token_pos)


def dpc_knn_assign(x: torch.Tensor, layout: WindowLayout, k: int = 5,
                   max_chunk_elems: Optional[int] = None
                   ) -> List[torch.Tensor]:
    """Cluster id of every token per scale (fp32, no grad, no autocast).

    Args:
        x: (B, N, C) tokens of the grid described by ``layout``.
        layout: Windows and cluster counts (:class:`WindowLayout`).
        k: Neighbours of the kNN density (the token itself included).
        max_chunk_elems: Bound on the elements of one distance block; None
            is the layout's plan's.

    Returns:
        Per scale, (B, N) long ids in ``[0, layout.totals[s])``, numbered
        window by window (row-major), by center score inside a window.
        Identity scales get ``arange(N)``.
    """
    stacked = None
    if layout.clustered and x.shape[0]:
        stacked = _assign_stacked(x, layout, k, max_chunk_elems)
    return _ids_per_scale(layout, x.shape[0], stacked)


def _ids_per_scale(layout: WindowLayout, b: int,
                   stacked: Optional[torch.Tensor]) -> List[torch.Tensor]:
    """Per scale, (B, N) ids: rows of ``stacked`` (S', B, N) for the
    clustered scales, ``arange(N)`` for the identity ones."""
    ids = [layout.token_ids.expand(b, -1)] * len(layout.identity)
    if stacked is not None:
        for i, s in enumerate(layout.clustered):
            ids[s] = stacked[i]
    return ids


def merge_tokens(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor,
                 num_clusters: int) -> torch.Tensor:
    """w-weighted mean of each cluster's members (normaliser + 1e-6).

    Args:
        x: (B, N, C) tokens; w: (B, N, 1) positive token weights.
        ids: (B, N) cluster of every token, in ``[0, num_clusters)``.

    Returns:
        (B, num_clusters, C); differentiable w.r.t. ``x`` and ``w``.
    """
    b, _, c = x.shape
    sums = _cluster_sums(ids[None], torch.cat([x * w, w], -1),
                         merge_rows(b, [num_clusters], x.device),
                         x.new_zeros(b * num_clusters, c + 1))
    return _normalise(sums, [b * num_clusters], b, c)[0]


def _cluster_sums(ids: torch.Tensor, weighted: torch.Tensor,
                  rows: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """(B * sum(totals), C + 1): per cluster, [sum of w x, sum of w].

    ``ids`` (S, B, N) per scale; ``weighted`` (B, N, C + 1) ``[x * w, w]``;
    ``rows`` :func:`merge_rows` and ``zeros`` a zero (B * sum(totals),
    C + 1) tensor of the batch. Numerators and denominators of every scale
    in one index_add.
    """
    src = weighted
    if ids.shape[0] > 1:
        src = src.expand(ids.shape[0], *weighted.shape)
    return zeros.index_add(0, (ids + rows).reshape(-1),
                           src.reshape(-1, weighted.shape[-1]))


def _normalise(sums: torch.Tensor, sizes: Sequence[int], b: int,
               c: int, dtype: Optional[torch.dtype] = None
               ) -> List[torch.Tensor]:
    """Rows [w-weighted sums, sum of w] -> means, split into (B, M, C);
    cast to ``dtype`` (None: kept) once for all of them."""
    merged = sums[:, :c] / (sums[:, c:] + 1e-6)
    if dtype is not None:
        merged = merged.to(dtype)
    out, start = [], 0
    for size in sizes:
        out.append(merged[start:start + size].view(b, size // b, c))
        start += size
    return out


def _summary_dtype(x: torch.Tensor) -> torch.dtype:
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


class DPCKNNClustering(nn.Module):
    """ClusTR's reducer: tokens -> cluster tokens at several scales.

    Has no parameters. Set ``record_assignments = True`` to keep the last
    forward's ids in ``self.assignments`` (a list of (B, N) long tensors, one
    per scale, numbered like the returned cluster tokens), for tests and
    visualisation; by default nothing is stored.

    A scale whose count equals the number of tokens (e.g. the fine scale of
    stage 3 at 224x224) skips clustering; its cluster tokens are the tokens
    scaled by ``w / (w + 1e-6)``, which is what the merge gives for
    singleton clusters.

    Args:
        sr_ratio (int): Reduction ratio; coarse count = n // sr_ratio**2.
        scale_factors (Sequence[int]): Count multiplier of each scale.
            Default (1, 4), ClusTR's two scales.
        k (int): Neighbours of the kNN density. Default 5.
        window_size (int, optional): Clustering window side in tokens; None is
            exact mode (one window per image). Default None.
        max_chunk_elems (int, optional): Largest distance chunk, in elements;
            bounds the clustering's memory. Default None: the device's
            :class:`~.window_layout.ClusteringPlan` (2**20 on the CPU,
            2**28 elsewhere).
        plan (ClusteringPlan, optional): How and by which implementation to
            cluster; None chooses from the device and what is installed
            (:func:`~.window_layout.plan_for`). Also an attribute, e.g. for
            the op census to count the CUDA path on a CPU.
        precision (str): The fused kernels' distance products: 'ieee'
            (default, exact fp32) or 'tf32x3' (opt in: 3xTF32 on tensor
            cores, a wider tie threshold; docs/backbones.md). Goes into the
            plan (a ``plan`` given here must agree with it); the reference
            and blocked implementations are IEEE fp32 and ignore it.
    """

    def __init__(self, sr_ratio: int, scale_factors: Sequence[int] = (1, 4),
                 k: int = 5, window_size: Optional[int] = None,
                 max_chunk_elems: Optional[int] = None,
                 plan: Optional[ClusteringPlan] = None,
                 precision: str = 'ieee'):
        super().__init__()
        if window_size is not None and window_size < 1:
            raise ValueError(f'window_size must be >= 1, got {window_size}')
        self.sr_ratio = sr_ratio
        self.scale_factors = tuple(scale_factors)
        self.k = k
        self.window_size = window_size
        self.max_chunk_elems = max_chunk_elems
        self.plan = plan
        self.precision = check_precision(precision)
        if plan is not None and plan.precision != self.precision:
            # the reducer's precision goes into whatever plan runs: a
            # different one in the plan would be silently replaced
            raise ValueError(
                f'plan.precision {plan.precision!r} and precision '
                f'{precision!r} disagree: set the precision with the '
                'precision argument')
        self.record_assignments = False
        self.assignments: Optional[List[torch.Tensor]] = None
        self._layout = None  # (key, WindowLayout) of the last grid seen

    def layout(self, hw: Tuple[int, int],
               device: torch.device) -> WindowLayout:
        """The :class:`WindowLayout` of an ``hw`` grid under :attr:`plan`
        (None: the device's), built once per size (rebuilt, not cached, while
        tracing or compiling)."""
        grid, plan = (int(hw[0]), int(hw[1])), self.plan or plan_for(device)
        plan = plan._replace(precision=self.precision)
        if is_tracing():
            return WindowLayout(grid, self.window_size, self.sr_ratio,
                                self.scale_factors, device, self.k, plan)
        key = (grid, device, plan)
        if self._layout is None or self._layout[0] != key:
            self._layout = (key, WindowLayout(grid, self.window_size,
                                              self.sr_ratio,
                                              self.scale_factors, device,
                                              self.k, plan))
        return self._layout[1]

    def cluster(self, x: torch.Tensor, w: torch.Tensor, hw: Tuple[int, int]
                ) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """Per-scale cluster tokens (B, M_s, C) and ids (B, N) of the tokens.

        x: (B, N, C) tokens of the ``hw`` grid, w: (B, N, 1) weights. Both
        are used in fp32 (cast once here if they are not). The cluster
        tokens come in ``x``'s dtype, or under autocast, for fp32 ``x``, in
        autocast's.
        """
        layout = self.layout(hw, x.device)
        b = x.shape[0]
        todo = layout.clustered
        dtype = _summary_dtype(x)
        if not b:  # empty batch (a size, not data: no sync)
            return ([x.new_zeros(0, m, x.shape[2], dtype=dtype)
                     for m in layout.totals],
                    _ids_per_scale(layout, 0, None))
        xf, wf = x.float(), w.float()
        stacked = None
        if todo:
            stacked = _assign_stacked(xf.detach(), layout, self.k,
                                      self.max_chunk_elems)
        ids = _ids_per_scale(layout, b, stacked)
        if self.record_assignments:
            self.assignments = ids
        with torch.autocast(x.device.type, enabled=False):
            c = x.shape[2]
            weighted = torch.cat([xf * wf, wf], -1)
            # Identity scales are singleton clusters: their sums are the
            # weighted tokens themselves, normalised along with the rest.
            sums, sizes = [], []
            if stacked is not None:
                consts = layout.window_batch(b, c)
                totals = [layout.totals[s] for s in todo]
                sums.append(_cluster_sums(stacked, weighted,
                                          consts.merge_rows,
                                          consts.merge_zeros))
                sizes += [b * m for m in totals]
            if len(todo) < len(ids):
                sums.append(weighted.reshape(-1, c + 1))
                sizes.append(b * x.shape[1])
            merged = _normalise(_cat(sums, 0), sizes, b, c, dtype)
            alone = merged[-1] if len(todo) < len(ids) else None
            out = [alone] * len(ids)
            for s, m in zip(todo, merged):
                out[s] = m
        return out, ids

    def forward(self, x: torch.Tensor, w: torch.Tensor,
                hw: Tuple[int, int]) -> List[torch.Tensor]:
        """x: (B, N, C) tokens, w: (B, N, 1) weights -> per-scale (B, M, C).

        (The registered reducer :class:`~.reducers.DPCKNN` wraps the same
        computation in the common reducer interface ``(x, hw, weights)``.)
        """
        return self.cluster(x, w, hw)[0]

    def extra_repr(self) -> str:
        mode = ('exact' if self.window_size is None else
                f'window {self.window_size}')
        extra = '' if self.precision == 'ieee' else f', {self.precision}'
        return (f'sr_ratio={self.sr_ratio}, scales={self.scale_factors}, '
                f'k={self.k}, {mode}{extra}')


def use_plan(model: nn.Module, plan: Optional[ClusteringPlan]) -> None:
    """Set the :class:`~.window_layout.ClusteringPlan` of every DPC-kNN
    reducer in ``model`` (None: back to the device's); e.g. the op census
    counts the CUDA path (``FUSED_PLAN``) on a CPU."""
    for m in model.modules():
        if isinstance(m, DPCKNNClustering):
            m.plan = plan

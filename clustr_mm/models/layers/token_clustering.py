"""DPC-kNN token clustering (ClusTR's key/value reducer) and weighted merge.

The algorithm follows the official code (see ``shared/reference/clustr.md``)
with three deliberate differences: ties are broken by token index instead of
random noise (deterministic), it always runs in fp32 without gradient, and the
N x N distance matrix is held in blocks of at most ``max_chunk_elems``
elements.

Every shape in the forward pass follows from the input size alone, so there
is no host synchronisation, the work is the same fixed sequence of kernels
whatever the data, and ``torch.compile`` / CUDA graphs / ``torch.jit.trace``
can capture it.

* The distance to the nearest denser token is a masked minimum over the
  distance block of every token at once (no data-dependent fallback list).
  When the block is too big to keep, tokens are taken in density order, so a
  row block needs only the columns before it (half the distance work).
* Clustering runs inside *windows* of the stage's token grid. Exact mode
  (``window_size=None``) is one window = the whole grid, i.e. the official
  per-image DPC-kNN; cost is quadratic in the tokens. Window mode
  (``window_size=s``) tiles the grid with ``min(s, H) x min(s, W)`` windows
  from the top-left, so a grid that fits one window is clustered exactly as
  in exact mode. Windows of one shape are clustered in one batched call;
  they are split into several calls only when the distance block would
  exceed ``max_chunk_elems``, and rows of one window only when a single
  window exceeds it. Cluster tokens of all windows are concatenated
  (row-major over windows), so keys/values stay global.
* Windows cut by the border are handled per device (:class:`~.window_layout.ClusteringPlan`).
  On accelerators they are zero-padded to the full shape and join the one
  call: a padded position is infinitely far from everything (+inf distances
  straight out of the GEMM) and less dense than any token, so it is never a
  neighbour, a denser token, a center or a member, nor in the largest
  distance (the padding costs distance work, e.g. 2x in stage 1 at 512 x 512,
  and buys one call instead of up to four). On the CPU each window shape
  gets its own unpadded call. Both give the same clusters.
* Everything that depends only on the grid size (window masks, cluster counts
  and id offsets per window, the token order) is built once per size by
  :class:`~.window_layout.WindowLayout` and kept on the device.

Cluster counts: a window of ``n`` tokens gets ``m = max(1, n // sr_ratio**2)``
clusters for the coarse scale and ``min(4 * m, n)`` for the fine one
(``scale_factors=(1, 4)``). A full default window thus gets the ImageNet
counts of its stage (49 and 196 with 56 x 56 tokens at stride 4); a border
window of e.g. 56 x 16 tokens at stride 4 gets 14 and 56.
"""
import math
import threading
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .graph_safety import is_tracing
from .window_layout import WindowBatch, WindowLayout, plan_for

_scratch = threading.local()
_SCRATCH_LIMIT = 1 << 24  # elements (64 MB) a CPU thread may keep for reuse


def _distance_chunk(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(a, b)``; on the CPU written into a reused per-thread buffer.

    A fresh multi-megabyte block per call costs first-touch page faults
    every time (glibc returns large freed blocks to the kernel): measured up
    to 40% of a stage-2 clustering at 224x224 on a 2-core CPU. Blocks up to
    64 MB reuse one buffer, and each is consumed before the next is made.
    Accelerators have caching allocators and get a plain ``bmm``, as do
    traces (FLOP counting's ``bmm`` handle takes no ``out``; dynamo).
    """
    if a.device.type != 'cpu' or is_tracing():
        return torch.bmm(a, b)
    shape = (a.shape[0], a.shape[1], b.shape[2])
    numel = math.prod(shape)
    if numel > _SCRATCH_LIMIT:
        return torch.bmm(a, b)
    buf = getattr(_scratch, 'buf', None)
    if buf is None or buf.numel() < numel:
        buf = _scratch.buf = torch.empty(numel, dtype=torch.float32)
    return torch.bmm(a, b, out=buf[:numel].view(shape))


def _cat(parts: List[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Chunks back together (no copy for a single chunk)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _augment(x: torch.Tensor, ones: Optional[torch.Tensor] = None,
             padding: Optional[torch.Tensor] = None
             ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows [x, |x|^2, 1] and columns [-2x, 1, |x|^2]^T: one GEMM of them
    gives all squared distances |a - b|^2. Columns are (G, C + 2, M).

    ``ones``: a cached (G, M, 1) tensor of ones, if there is one.
    ``padding``: (G, M) bool; a padded position (x = 0) gets |x|^2 = +inf,
    so every distance to or from it is +inf straight out of the GEMM (the
    inf only ever meets the constant 1, never a 0, so no NaN).
    """
    sq = x.pow(2).sum(-1, keepdim=True)
    if padding is not None:
        sq = sq.masked_fill_(padding[..., None], float('inf'))
    if ones is None:
        ones = torch.ones_like(sq)
    return (torch.cat([x, sq, ones], -1),
            torch.cat([-2 * x, ones, sq], -1).transpose(1, 2))


def _rows_aug(x: torch.Tensor) -> torch.Tensor:
    """[x, |x|^2, 1]; with :func:`_cols_aug` one GEMM gives |a - b|^2."""
    return _augment(x)[0]


def _cols_aug(x: torch.Tensor) -> torch.Tensor:
    """[-2x, 1, |x|^2], transposed to (G, C + 2, M) for ``bmm``."""
    return _augment(x)[1]


def _k_smallest(d: torch.Tensor, k: int, block: int = 64) -> torch.Tensor:
    """``d.topk(k, largest=False).values`` along the last dim, with fewer
    comparisons on long rows.

    Exact: every entry outside the k blocks with the smallest minima is >= k
    entries inside them (each block's minimum), so those blocks plus the
    ragged tail hold a k-smallest set. Only ``k * block`` candidates per row
    reach topk. Fixed shapes: no host sync.
    """
    m = d.shape[-1]
    nb = m // block
    if nb < 32 or nb <= 2 * k:  # plain topk is faster on short rows
        return d.topk(k, dim=-1, largest=False).values
    main = d[..., :nb * block].unflatten(-1, (nb, block))
    blk = main.amin(-1).topk(k, dim=-1, largest=False).indices
    cand = main.gather(-2, blk[..., None].expand(*blk.shape, block))
    cand = cand.flatten(-2)
    if nb * block < m:
        cand = torch.cat([cand, d[..., nb * block:]], -1)
    return cand.topk(k, dim=-1, largest=False).values


def _dpc_knn_windows(x: torch.Tensor, counts: Sequence[int], k: int,
                     max_chunk_elems: int, blocked_knn: bool,
                     consts: WindowBatch) -> torch.Tensor:
    """DPC-kNN in each of G windows of n (possibly padded) tokens.

    Args:
        x: (G, n, C) fp32 tokens, zero at padded positions.
        counts: Clusters per scale (the most any window gets); scale s uses
            the first ``counts[s]`` centers, so the scales are nested.
        k: Neighbours for the density (the token itself included).
        max_chunk_elems: Bound on the elements of one distance block.
        blocked_knn: Find the k nearest with :func:`_k_smallest`.
        consts: Masks of this slice of windows (:class:`WindowBatch`).

    Returns:
        (S, G, n) cluster index of every token, per scale (padded positions
        get arbitrary ids).
    """
    g, n, c = x.shape
    k_eff = min(k, n)
    inf = float('inf')
    invalid = consts.invalid
    rows, cols = _augment(x, consts.ones, invalid)
    # Rows of one block; < n when the windows' whole blocks exceed the budget.
    step = n if g * n * n <= max_chunk_elems else max(
        1, max_chunk_elems // (g * n))

    def knn(d):
        return (_k_smallest(d, k_eff) if blocked_knn else
                d.topk(k_eff, dim=-1, largest=False).values)

    # Pass 1: the k nearest (self included) per token, the largest distance.
    row_max, knn_d, whole = [], [], None
    for r0 in range(0, n, step):
        d = _distance_chunk(rows[:, r0:r0 + step], cols)
        d.diagonal(offset=r0, dim1=1, dim2=2).zero_()
        knn_d.append(knn(d))
        if invalid is not None:  # distances to/from padding leave the max
            d = d.nan_to_num_(posinf=0.0)
        row_max.append(d.amax((1, 2))[:, None] if step >= n else d.amax(-1))
        whole = d if step >= n else None
    row_max, knn_d = _cat(row_max), _cat(knn_d)
    if consts.knn_scale is not None:  # windows with fewer than k tokens
        knn_d = knn_d.nan_to_num_(posinf=0.0)
    dmax2 = row_max[:, 0] if row_max.shape[1] == 1 else row_max.amax(-1)
    mean = knn_d.clamp_(min=0).mean(-1)
    if consts.knn_scale is not None:
        mean = mean * consts.knn_scale
    rho = torch.exp(mean.div_(-c))  # = exp(-mean / c), sign flips exactly
    if invalid is not None:
        rho = rho.masked_fill_(invalid, -1.0)  # padding: least dense

    # Density order, ties to the lower index; "denser" = earlier in order.
    order = torch.sort(rho, dim=1, descending=True, stable=True).indices

    # Pass 2: distance to the nearest denser token, for every token (padding
    # is never denser than a real token).
    if whole is not None:  # the block is still there: mask by rank
        rank = order.argsort(dim=1)
        delta2 = whole.masked_fill_(rank[:, None, :] >= rank[:, :, None],
                                    inf).amin(-1)
    else:
        delta2 = _nearest_denser(rows, cols, order, step, consts.positions)
    # The densest token (no denser one: inf) gets the largest distance in
    # the window; every other delta2 is one of the distances, so <= dmax2.
    delta2 = torch.minimum(delta2, dmax2[:, None])
    score = rho * delta2.clamp_(min=0).div_(c).sqrt_()
    if invalid is not None:
        score = score.masked_fill_(invalid, -inf)
    num = max(counts)
    centers = torch.sort(score, dim=1, descending=True,
                         stable=True).indices[:, :num]

    # Every token joins its nearest center; a center joins itself: -inf at
    # its own slot, which every scale it belongs to sees.
    center_cols = cols.gather(2, centers[:, None, :].expand(-1, c + 2, -1))
    if step >= n:
        dist = torch.bmm(rows, center_cols)
        return _nearest_center(dist.scatter_(1, centers[:, None, :], -inf),
                               counts, consts)
    # Row blocks, each finished before the next.
    return torch.cat([
        _nearest_center(
            torch.bmm(rows[:, r0:r0 + step], center_cols).masked_fill_(
                centers[:, None, :] == consts.positions[r0:r0 + step, None],
                -inf), counts, consts) for r0 in range(0, n, step)], 2)


def _nearest_denser(rows: torch.Tensor, cols: torch.Tensor,
                    order: torch.Tensor, step: int,
                    positions: torch.Tensor) -> torch.Tensor:
    """(G, n) squared distance of every token to its nearest denser one
    (+inf for the densest), from row blocks of ``step`` tokens.

    The tokens are taken in density order, so the denser tokens of the i-th
    are the first i: block [r0, r1) needs only columns [0, r1) (half the
    distance work of all pairs), and only its diagonal square is masked.
    """
    c2 = rows.shape[2]
    rows_o = rows.gather(1, order[..., None].expand(-1, -1, c2))
    cols_o = cols.gather(2, order[:, None, :].expand(-1, c2, -1))
    later = positions[:step] >= positions[:step, None]  # not denser
    parts = []
    for r0 in range(0, rows.shape[1], step):
        d = _distance_chunk(rows_o[:, r0:r0 + step], cols_o[..., :r0 + step])
        r = d.shape[1]
        d[..., r0:].masked_fill_(later[:r, :r], float('inf'))
        parts.append(d.amin(-1))
    by_order = _cat(parts)  # back from density order to token order
    return torch.empty_like(by_order).scatter_(1, order, by_order)


def _nearest_center(dist: torch.Tensor, counts: Sequence[int],
                    consts: WindowBatch) -> torch.Tensor:
    """(G, rows, K) distances to the centers -> (S, G, rows) ids.

    argmin takes the first minimum, so the better center wins ties; all
    scales in one argmin, slots that are not centers of a scale set to +inf.
    """
    if len(counts) == 1 and consts.center_valid is None:
        return dist[..., :counts[0]].argmin(-1)[None]
    return torch.where(consts.center_valid[:, :, None, :], dist,
                       consts.inf).argmin(-1)


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
            # Whole windows per call, as many as fit the block budget.
            per_call = max(1, budget // (n * n))
            parts = []
            for g0 in range(0, win.shape[0], per_call):
                sl = (slice(0, None) if per_call >= win.shape[0] else
                      slice(g0, g0 + per_call))
                parts.append(_dpc_knn_windows(
                    win[sl], counts, k, budget, layout.plan.blocked_knn,
                    group_consts.windows(sl)))
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
    b, n, c = x.shape
    flat = (ids + torch.arange(b, device=x.device)[:, None] *
            num_clusters).reshape(-1)
    num = x.new_zeros(b * num_clusters, c).index_add(
        0, flat, (x * w).reshape(-1, c))
    den = w.new_zeros(b * num_clusters, 1).index_add(0, flat, w.reshape(-1, 1))
    return (num / (den + 1e-6)).reshape(b, num_clusters, c)


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
               c: int) -> List[torch.Tensor]:
    """Rows [w-weighted sums, sum of w] -> means, split into (B, M, C)."""
    merged = sums[:, :c] / (sums[:, c:] + 1e-6)
    out, start = [], 0
    for size in sizes:
        out.append(merged[start:start + size].view(b, size // b, c))
        start += size
    return out


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
    """

    def __init__(self, sr_ratio: int, scale_factors: Sequence[int] = (1, 4),
                 k: int = 5, window_size: Optional[int] = None,
                 max_chunk_elems: Optional[int] = None):
        super().__init__()
        if window_size is not None and window_size < 1:
            raise ValueError(f'window_size must be >= 1, got {window_size}')
        self.sr_ratio = sr_ratio
        self.scale_factors = tuple(scale_factors)
        self.k = k
        self.window_size = window_size
        self.max_chunk_elems = max_chunk_elems
        self.record_assignments = False
        self.assignments: Optional[List[torch.Tensor]] = None
        self._layout = None  # (key, WindowLayout) of the last grid seen

    def layout(self, hw: Tuple[int, int],
               device: torch.device) -> WindowLayout:
        """The :class:`WindowLayout` of an ``hw`` grid under the device's
        plan, built once per size (rebuilt, not cached, while tracing or
        compiling)."""
        grid, plan = (int(hw[0]), int(hw[1])), plan_for(device)
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

        x: (B, N, C) tokens of the ``hw`` grid, w: (B, N, 1) weights.
        """
        layout = self.layout(hw, x.device)
        b = x.shape[0]
        todo = layout.clustered
        if not b:  # empty batch (a size, not data: no sync)
            return ([x.new_zeros(0, m, x.shape[2]) for m in layout.totals],
                    _ids_per_scale(layout, 0, None))
        stacked = None
        if todo:
            stacked = _assign_stacked(x.detach(), layout, self.k,
                                      self.max_chunk_elems)
        ids = _ids_per_scale(layout, b, stacked)
        if self.record_assignments:
            self.assignments = ids
        with torch.autocast(x.device.type, enabled=False):
            xf, wf = x.float(), w.float()
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
            merged = _normalise(_cat(sums, 0), sizes, b, c)
            alone = merged[-1] if len(todo) < len(ids) else None
            out = [alone] * len(ids)
            for s, m in zip(todo, merged):
                out[s] = m
        return [o.to(x.dtype) for o in out], ids

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
        return (f'sr_ratio={self.sr_ratio}, scales={self.scale_factors}, '
                f'k={self.k}, {mode}')

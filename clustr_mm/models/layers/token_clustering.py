"""DPC-kNN token clustering (ClusTR's key/value reducer) and weighted merge.

The algorithm follows the official code (see ``shared/reference/clustr.md``)
with three deliberate differences: ties are broken by token index instead of
random noise (deterministic), it always runs in fp32 without gradient, and the
N x N distance matrix is never held whole. It is produced in row chunks of at
most ``max_chunk_elems`` elements; one pass over the chunks yields each
token's k nearest neighbours (density) and the largest distance. The distance
to the nearest denser token is read off the neighbour list whenever a denser
token is in it; only the rest (local density peaks, typically a small
fraction) get a second, full row search.

Clustering runs inside *windows* of the stage's token grid:

* exact mode (``window_size=None``): one window = the whole grid, i.e. the
  official per-image DPC-kNN. Cost is quadratic in the number of tokens.
* window mode (``window_size=s``): ``min(s, H) x min(s, W)`` windows tile the
  grid from the top-left, so a grid that fits in one window is clustered
  exactly as in exact mode. Windows in the last row/column are cut by the
  border and are simply smaller: there is no padding, hence no padded token
  can be a center, a neighbour or a member, and no work is spent on padding.
  Windows of equal shape (at most four groups: full, right edge, bottom edge,
  corner) are clustered in one batched call. The cluster tokens of all
  windows are concatenated (row-major over windows), so keys/values stay
  global.

Cluster counts: a window of ``n`` tokens gets ``m = max(1, n // sr_ratio**2)``
clusters for the coarse scale and ``min(4 * m, n)`` for the fine one
(``scale_factors=(1, 4)``). A full default window thus gets the ImageNet
counts of its stage (49 and 196 with 56 x 56 tokens at stride 4); a border
window of e.g. 56 x 16 tokens at stride 4 gets 14 and 56.
"""
import math
import threading
from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch
from torch import nn

_scratch = threading.local()


def _distance_chunk(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(a, b)``; on the CPU written into a reused per-thread buffer.

    A fresh multi-megabyte chunk per call costs first-touch page faults
    every time (glibc returns large freed blocks to the kernel): measured up
    to 40% of a stage-2 clustering at 224x224 on a 2-core CPU. The buffer
    holds one chunk (``max_chunk_elems`` floats, 4 MB at the CPU default)
    and each chunk is consumed before the next is computed. Accelerators
    have caching allocators and get a plain ``bmm``, as does a jit trace
    (FLOP counting, whose ``bmm`` handle takes no ``out``).
    """
    if a.device.type != 'cpu' or torch.jit.is_tracing():
        return torch.bmm(a, b)
    shape = (a.shape[0], a.shape[1], b.shape[2])
    numel = math.prod(shape)
    buf = getattr(_scratch, 'buf', None)
    if buf is None or buf.numel() < numel:
        buf = _scratch.buf = torch.empty(numel, dtype=torch.float32)
    return torch.bmm(a, b, out=buf[:numel].view(shape))


def _rows_aug(x: torch.Tensor) -> torch.Tensor:
    """[x, |x|^2, 1]; with :func:`_cols_aug` one GEMM gives |a - b|^2."""
    sq = x.pow(2).sum(-1, keepdim=True)
    return torch.cat([x, sq, torch.ones_like(sq)], -1)


def _cols_aug(x: torch.Tensor) -> torch.Tensor:
    """[-2x, 1, |x|^2], transposed to (G, C + 2, M) for ``bmm``."""
    sq = x.pow(2).sum(-1, keepdim=True)
    return torch.cat([-2 * x, torch.ones_like(sq), sq], -1).transpose(1, 2)


def _k_smallest(d: torch.Tensor, k: int,
                block: int = 64) -> Tuple[torch.Tensor, torch.Tensor]:
    """``d.topk(k, largest=False)`` along the last dim, with fewer comparisons.

    Exact: every entry outside the k blocks with the smallest minima is >= k
    entries inside them (one per block), so those blocks plus the ragged tail
    hold a k-smallest set. Only ``k * block`` candidates per row reach topk.
    """
    m = d.shape[-1]
    nb = m // block
    if nb < 32 or nb <= 2 * k:  # plain topk is faster on short rows
        return d.topk(k, dim=-1, largest=False)
    main = d[..., :nb * block].unflatten(-1, (nb, block))
    blk = main.amin(-1).topk(k, dim=-1, largest=False).indices
    cand = main.gather(-2, blk[..., None].expand(*blk.shape, block))
    cols = blk[..., None] * block + torch.arange(block, device=d.device)
    cand, cols = cand.flatten(-2), cols.flatten(-2)
    if nb * block < m:
        tail = torch.arange(nb * block, m, device=d.device)
        cand = torch.cat([cand, d[..., nb * block:]], -1)
        cols = torch.cat([cols, tail.expand(*cols.shape[:-1], -1)], -1)
    values, pos = cand.topk(k, dim=-1, largest=False)
    return values, cols.gather(-1, pos)


def _assign_to_centers(rows: torch.Tensor, x: torch.Tensor,
                       centers: torch.Tensor, counts: Sequence[int],
                       max_chunk_elems: int) -> torch.Tensor:
    """Nearest-center index per token for every scale; centers join themselves.

    Args:
        rows: (G, n, C + 2) ``_rows_aug(x)``; x: (G, n, C) window tokens.
        centers: (G, K) token indices, best score first.
        counts: Clusters per scale (<= K); scale s uses the first
            ``counts[s]`` centers, so the scales are nested.
        max_chunk_elems: Bound on one (G, rows, K) distance chunk.

    Returns:
        (S, G, n) cluster index in ``[0, counts[s])``.
    """
    g, n, c = x.shape
    num = centers.shape[1]
    cols = _cols_aug(x.gather(1, centers[..., None].expand(-1, -1, c)))
    out = torch.empty(len(counts), g, n, dtype=torch.long, device=x.device)
    step = max(1, max_chunk_elems // (g * num))
    for r0 in range(0, n, step):
        dist = _distance_chunk(rows[:, r0:r0 + step], cols)  # (G, rows, K)
        for s, cnt in enumerate(counts):
            # argmin returns the first minimum: the better center wins ties.
            out[s, :, r0:r0 + step] = dist[..., :cnt].argmin(-1)
    for s, cnt in enumerate(counts):
        out[s].scatter_(1, centers[:, :cnt],
                        torch.arange(cnt, device=x.device).expand(g, -1))
    return out


def _dpc_knn_group(x: torch.Tensor, counts: Sequence[int], k: int,
                   max_chunk_elems: int) -> torch.Tensor:
    """DPC-kNN on G windows of n tokens each (fp32, no grad).

    Args:
        x: (G, n, C) tokens.
        counts: Clusters per scale.
        k: Neighbours for the density (the token itself included).
        max_chunk_elems: Bound on the elements of one distance chunk.

    Returns:
        (S, G, n) cluster index of every token, per scale.
    """
    g, n, c = x.shape
    k_eff = min(k, n)
    step = max(1, max_chunk_elems // (g * n))
    rows, cols = _rows_aug(x), _cols_aug(x)

    # Pass over row chunks: largest distance, k nearest (self included).
    knn_d = x.new_empty(g, n, k_eff)
    knn_i = torch.empty(g, n, k_eff, dtype=torch.long, device=x.device)
    dmax2 = x.new_zeros(g)
    for r0 in range(0, n, step):
        d = _distance_chunk(rows[:, r0:r0 + step], cols)
        dmax2 = torch.maximum(dmax2, d.amax((1, 2)))
        d.diagonal(offset=r0, dim1=1, dim2=2).zero_()
        knn_d[:, r0:r0 + step], knn_i[:, r0:r0 + step] = _k_smallest(
            d, k_eff)
    rho = torch.exp(-knn_d.clamp_(min=0).mean(-1) / c)

    # Density rank, ties to the lower index; "denser" means lower rank.
    order = torch.sort(rho, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(n, device=x.device).expand(g, -1))

    # The neighbour lists are sorted by distance, so the first denser token
    # in a list is the nearest denser token overall.
    nbr_rank = rank.gather(1, knn_i.flatten(1)).view(g, n, k_eff)
    denser = nbr_rank < rank[..., None]
    first = torch.where(denser, torch.arange(k_eff, device=x.device),
                        k_eff).amin(-1)
    delta2 = knn_d.gather(-1, first.clamp(max=k_eff - 1)[..., None])[..., 0]
    # Tokens without a denser neighbour (but the densest): full row search.
    need = (first == k_eff) & (rank > 0)
    n_need = int(need.sum(-1).max())
    if n_need:
        sel = torch.sort(need.byte(), dim=1, descending=True,
                         stable=True).indices[:, :n_need]
        rows_sel = rows.gather(1, sel[..., None].expand(-1, -1, c + 2))
        rank_sel = rank.gather(1, sel)
        best = x.new_empty(g, n_need)
        for r0 in range(0, n_need, step):
            d = _distance_chunk(rows_sel[:, r0:r0 + step], cols)
            not_denser = rank[:, None, :] >= rank_sel[:, r0:r0 + step, None]
            best[:, r0:r0 + step] = d.masked_fill_(not_denser,
                                                   float('inf')).amin(-1)
        delta2.scatter_(1, sel, torch.where(need.gather(1, sel), best,
                                            delta2.gather(1, sel)))
    # The densest token's delta is the largest distance in the window.
    delta2 = torch.where(rank == 0, dmax2[:, None], delta2)
    score = rho * (delta2.clamp(min=0) / c).sqrt()

    centers = torch.sort(score, dim=1, descending=True,
                         stable=True).indices[:, :max(counts)]
    return _assign_to_centers(rows, x, centers, counts, max_chunk_elems)


class Band(NamedTuple):
    """A run of ``count`` equal windows of ``size`` tokens along one axis."""
    index: int  # index of the band's first window along the axis
    start: int  # token offset of the band
    count: int
    size: int


def _bands(length: int, size: int) -> List[Band]:
    full, rest = divmod(length, size)
    bands = [Band(0, 0, full, size)]
    if rest:
        bands.append(Band(full, full * size, 1, rest))
    return bands


class WindowLayout:
    """How a stage's token grid is tiled by clustering windows.

    Args:
        hw: (H, W) of the token grid.
        window_size: Window side in tokens; None covers the grid with one.
        sr_ratio: Reduction ratio r of the stage (coarse count n // r^2).
        scale_factors: Cluster count multipliers of the scales.
        device: Device of ``offsets``.

    Attributes:
        groups: ``(row_band, col_band, counts)`` per group of equal windows.
        offsets: (S, nH, nW) id of each window's first cluster, per scale.
        totals: Number of clusters per scale.
        identity: Per scale, whether every token is its own cluster.
    """

    def __init__(self, hw: Tuple[int, int], window_size: Optional[int],
                 sr_ratio: int, scale_factors: Sequence[int] = (1, 4),
                 device: Optional[torch.device] = None):
        self.hw = (h, w) = tuple(hw)
        size = window_size or max(h, w)
        rows, cols = _bands(h, min(size, h)), _bands(w, min(size, w))
        table = torch.zeros(len(scale_factors), rows[-1].index + 1,
                            cols[-1].index + 1, dtype=torch.long)
        self.groups = []
        self.identity = [True] * len(scale_factors)
        for rb in rows:
            for cb in cols:
                n = rb.size * cb.size
                base = max(1, n // sr_ratio**2)
                counts = [min(f * base, n) for f in scale_factors]
                self.groups.append((rb, cb, counts))
                for s, cnt in enumerate(counts):
                    table[s, rb.index:rb.index + rb.count,
                          cb.index:cb.index + cb.count] = cnt
                    self.identity[s] &= cnt == n
        flat = table.flatten(1)
        self.totals = flat.sum(1).tolist()
        self.offsets = (flat.cumsum(1) - flat).view_as(table).to(device)


def default_chunk_elems(device: torch.device) -> int:
    """2**20 on CPU (4 MB chunks stay in cache: fastest there), 2**26 on
    accelerators (fewer, larger kernels)."""
    return 1 << 20 if device.type == 'cpu' else 1 << 26


@torch.no_grad()
def dpc_knn_assign(x: torch.Tensor, layout: WindowLayout, k: int = 5,
                   max_chunk_elems: Optional[int] = None
                   ) -> List[torch.Tensor]:
    """Cluster id of every token per scale (fp32, no grad, no autocast).

    Args:
        x: (B, N, C) tokens of the grid described by ``layout``.
        layout: Windows and cluster counts (:class:`WindowLayout`).
        k: Neighbours of the kNN density (the token itself included).
        max_chunk_elems: Bound on the elements of one distance chunk; None
            picks :func:`default_chunk_elems` for the device.

    Returns:
        Per scale, (B, N) long ids in ``[0, layout.totals[s])``, numbered
        window by window (row-major), by center score inside a window.
        Identity scales get ``arange(N)``.
    """
    b, n_tok, c = x.shape
    (h, w), device = layout.hw, x.device
    max_chunk_elems = max_chunk_elems or default_chunk_elems(device)
    todo = [s for s, ident in enumerate(layout.identity) if not ident]
    ids = [torch.arange(n_tok, device=device).expand(b, -1)] * len(
        layout.identity)
    if not todo or b == 0:
        return ids
    if not torch.isfinite(x).all():
        raise FloatingPointError(
            'DPC-kNN got non-finite tokens (NaN/Inf): the activations '
            'diverged, and every distance and assignment would be meaningless')
    with torch.autocast(device.type, enabled=False):
        grid = x.float().reshape(b, h, w, c)
        out = torch.empty(len(todo), b, h, w, dtype=torch.long, device=device)
        for rb, cb, counts in layout.groups:
            counts = [counts[s] for s in todo]
            rs = slice(rb.start, rb.start + rb.count * rb.size)
            cs = slice(cb.start, cb.start + cb.count * cb.size)
            n = rb.size * cb.size
            win = grid[:, rs, cs].reshape(b, rb.count, rb.size, cb.count,
                                          cb.size, c)
            win = win.permute(0, 1, 3, 2, 4, 5).reshape(-1, n, c)
            if all(cnt == n for cnt in counts):
                local = torch.arange(n, device=device).expand(
                    len(todo), win.shape[0], -1)
            else:
                # Whole windows per call if they fit the chunk budget.
                per_call = max(1, max_chunk_elems // (n * n))
                local = torch.cat([
                    _dpc_knn_group(win[i:i + per_call], counts, k,
                                   max_chunk_elems)
                    for i in range(0, win.shape[0], per_call)
                ], dim=1)
            local = local.view(len(todo), b, rb.count, cb.count, rb.size,
                               cb.size)
            offsets = layout.offsets[todo][:, rb.index:rb.index + rb.count,
                                           cb.index:cb.index + cb.count]
            local = local + offsets[:, None, :, :, None, None]
            out[:, :, rs, cs] = local.permute(0, 1, 2, 4, 3, 5).reshape(
                len(todo), b, rb.count * rb.size, cb.count * cb.size)
    for i, s in enumerate(todo):
        ids[s] = out[i].view(b, n_tok)
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
            bounds the clustering's memory. Default None:
            :func:`default_chunk_elems` of the input's device.
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
        key = (tuple(hw), device)
        if self._layout is None or self._layout[0] != key:
            self._layout = (key,
                            WindowLayout(hw, self.window_size, self.sr_ratio,
                                         self.scale_factors, device))
        return self._layout[1]

    def cluster(self, x: torch.Tensor, w: torch.Tensor, hw: Tuple[int, int]
                ) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        """Per-scale cluster tokens (B, M_s, C) and ids (B, N) of the tokens.

        x: (B, N, C) tokens of the ``hw`` grid, w: (B, N, 1) weights.
        """
        layout = self.layout(hw, x.device)
        ids = dpc_knn_assign(x.detach(), layout, self.k, self.max_chunk_elems)
        if self.record_assignments:
            self.assignments = ids
        with torch.autocast(x.device.type, enabled=False):
            xf, wf = x.float(), w.float()
            out = [
                xf * (wf / (wf + 1e-6)) if ident else merge_tokens(
                    xf, wf, idx, total) for idx, ident, total in zip(
                        ids, layout.identity, layout.totals)
            ]
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

"""DPC-kNN token clustering (ClusTR's key/value reducer) and the weighted merge.

The algorithm follows the official code (see ``shared/reference/clustr.md``)
with three deliberate differences: ties are broken by token index instead of
random noise (deterministic), it always runs in fp32 without gradient, and the
N x N distance matrix is never held whole: it is produced in row chunks of at
most ``max_chunk_elems`` elements, in two passes (density, then the distance
to the nearest denser token).

Clustering runs inside *windows* of the stage's token grid:

* exact mode (``window_size=None``): one window = the whole grid, i.e. the
  official per-image DPC-kNN. Cost is quadratic in the number of tokens.
* window mode (``window_size=s``): the grid is tiled from the top-left by
  ``s x s`` windows (``min(s, H) x min(s, W)`` when the grid is smaller, so a
  grid that fits in one window is clustered exactly as in exact mode). Windows
  cut by the bottom/right border are padded; padded tokens are never centers,
  never neighbours and never members. The cluster tokens of all windows are
  concatenated (window-major), so keys/values stay global.

Cluster counts. A window holding ``n`` real tokens gets
``m = max(1, n // sr_ratio**2)`` clusters for the coarse scale and
``min(4 * m, n)`` for the fine one (``scale_factors=(1, 4)``). A full default
window therefore gets the ImageNet counts of the stage, e.g. 49 and 196 at
stride 4 with a 56 x 56 window; a partial window gets proportionally fewer.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# Added to the squared norm of padded columns so they are never among the
# k nearest neighbours; finite so that no inf * 0 can arise inside the GEMM.
_FAR = 1e30


def _rows_aug(x: torch.Tensor) -> torch.Tensor:
    """[x, |x|^2, 1]; with :func:`_cols_aug` one GEMM gives |a - b|^2."""
    sq = x.pow(2).sum(-1, keepdim=True)
    return torch.cat([x, sq, torch.ones_like(sq)], -1)


def _cols_aug(x: torch.Tensor,
              bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[-2x, 1, |x|^2 + bias], transposed to (G, C + 2, M) for ``bmm``."""
    sq = x.pow(2).sum(-1, keepdim=True)
    if bias is not None:
        sq = sq + bias[..., None]
    return torch.cat([-2 * x, torch.ones_like(sq), sq], -1).transpose(1, 2)


def _assign_to_centers(x: torch.Tensor, centers: torch.Tensor,
                       counts: torch.Tensor) -> torch.Tensor:
    """Nearest-center index per token for every scale; centers join themselves.

    Args:
        x: (G, n, C) window tokens.
        centers: (G, K) token indices, best score first.
        counts: (S, G) number of clusters per scale and window (<= K); scale s
            uses the first ``counts[s, g]`` centers (scales are nested).

    Returns:
        (S, G, n) cluster index in ``[0, counts[s, g])``.
    """
    g, _, c = x.shape
    xc = x.gather(1, centers[..., None].expand(-1, -1, c))
    dist = torch.bmm(_rows_aug(x), _cols_aug(xc))  # (G, n, K)
    rank = torch.arange(centers.shape[1], device=x.device)
    out = []
    for cnt in counts:
        kmax = int(cnt.max())
        d = dist[..., :kmax]
        if bool((cnt < kmax).any()):
            d = d.masked_fill(rank[:kmax] >= cnt[:, None, None], float('inf'))
        idx = d.argmin(-1)  # first minimum: the better-scored center wins ties
        own = rank[None, :kmax] < cnt[:, None]
        ctr = centers[:, :kmax]
        idx.scatter_(1, ctr, torch.where(own, rank[:kmax].expand(g, -1),
                                         idx.gather(1, ctr)))
        out.append(idx)
    return torch.stack(out)


def _dpc_knn_group(x: torch.Tensor, valid: Optional[torch.Tensor],
                   counts: torch.Tensor, k: int,
                   chunk_rows: int) -> torch.Tensor:
    """DPC-kNN on a group of equally shaped windows (fp32, no grad).

    Args:
        x: (G, n, C) tokens; ``valid`` (G, n) bool marks real tokens (None:
            all real). Token 0 of every window must be real.
        counts: (S, G) clusters per scale and window.
        k: neighbours for the density (the token itself included).
        chunk_rows: rows of the distance matrix computed at once.

    Returns:
        (S, G, n) cluster index of every token, per scale.
    """
    g, n, c = x.shape
    k_eff = min(k, n)

    # Pass 1: density rho = exp(-mean of the k smallest squared distances / C).
    rows = _rows_aug(x)
    cols = _cols_aug(x, None if valid is None else (~valid).float() * _FAR)
    knn = x.new_empty(g, n, k_eff)
    for r0 in range(0, n, chunk_rows):
        d = torch.bmm(rows[:, r0:r0 + chunk_rows], cols)
        d.diagonal(offset=r0, dim1=1, dim2=2).zero_()
        knn[:, r0:r0 + chunk_rows] = d.topk(
            k_eff, dim=-1, largest=False).values
    knn.clamp_(min=0)
    if valid is None:
        mean = knn.mean(-1)
        rho = torch.exp(-mean / c)
    else:
        # A window with fewer than k real tokens averages over all of them.
        kk = valid.sum(-1).clamp(max=k_eff)
        use = torch.arange(k_eff, device=x.device) < kk[:, None, None]
        mean = torch.where(use, knn, 0).sum(-1) / kk[:, None]
        rho = torch.exp(-mean / c).masked_fill(~valid, -1.0)  # padded last

    # Pass 2, in density order (ties: lower index is denser): the tokens
    # denser than row p are the columns q < p, so only the lower triangle is
    # computed. Padded tokens are copies of token 0, which keeps the maximum
    # pairwise distance (the densest token's delta) that of the real tokens.
    order = torch.sort(rho, dim=1, descending=True, stable=True).indices
    xs = x if valid is None else torch.where(valid[..., None], x, x[:, :1])
    xs = xs.gather(1, order[..., None].expand(-1, -1, c))
    rows, cols = _rows_aug(xs), _cols_aug(xs)
    delta2 = x.new_empty(g, n)
    dmax2 = x.new_zeros(g)
    for r0 in range(0, n, chunk_rows):
        r1 = min(n, r0 + chunk_rows)
        d = torch.bmm(rows[:, r0:r1], cols[..., :r1])
        dmax2 = torch.maximum(dmax2, d.amax((1, 2)))
        upper = torch.ones(r1 - r0, r1, dtype=torch.bool,
                           device=x.device).triu_(r0)
        delta2[:, r0:r1] = d.masked_fill_(upper, float('inf')).amin(-1)
    delta2[:, 0] = dmax2
    delta = (delta2.clamp(min=0) / c).sqrt()
    score = torch.empty_like(rho).scatter_(1, order, rho.gather(1, order) *
                                           delta)
    if valid is not None:
        score = score.masked_fill(~valid, -1.0)

    centers = torch.sort(score, dim=1, descending=True,
                         stable=True).indices[:, :int(counts.max())]
    return _assign_to_centers(x, centers, counts)


class WindowLayout:
    """How a stage's (H, W) token grid is tiled by clustering windows.

    Args:
        hw: (H, W) of the token grid.
        window_size: Window side in tokens; None covers the grid with one.
        sr_ratio: Reduction ratio r of the stage (coarse count n // r^2).
        scale_factors: Cluster count multipliers of the scales.
        device: Device of the index tensors.
    """

    def __init__(self, hw: Tuple[int, int], window_size: Optional[int],
                 sr_ratio: int, scale_factors: Sequence[int],
                 device: torch.device):
        self.h, self.w = hw
        ws = window_size or max(hw)
        self.wh, self.ww = min(ws, self.h), min(ws, self.w)
        self.nh, self.nw = -(-self.h // self.wh), -(-self.w // self.ww)
        self.padded = (self.nh * self.wh, self.nw * self.ww) != (self.h,
                                                                   self.w)
        grid = torch.zeros(self.nh * self.wh, self.nw * self.ww,
                           dtype=torch.bool, device=device)
        grid[:self.h, :self.w] = True
        self.valid = self.partition(grid[None, ..., None])[..., 0]  # (nW, n)
        n_real = self.valid.sum(-1)
        base = (n_real // sr_ratio**2).clamp(min=1)
        self.counts = torch.stack(
            [torch.minimum(f * base, n_real) for f in scale_factors])
        # A scale keeps every token as its own cluster (identity).
        self.identity = [bool((cnt == n_real).all()) for cnt in self.counts]
        self.totals = [int(cnt.sum()) for cnt in self.counts]

    @property
    def num_windows(self) -> int:
        return self.nh * self.nw

    def partition(self, t: torch.Tensor) -> torch.Tensor:
        """(B, H, W, C) (unpadded or padded) -> (B * nW, wh * ww, C)."""
        b, h, w, c = t.shape
        t = F.pad(t, (0, 0, 0, self.nw * self.ww - w, 0,
                      self.nh * self.wh - h))
        t = t.reshape(b, self.nh, self.wh, self.nw, self.ww, c)
        return t.permute(0, 1, 3, 2, 4, 5).reshape(-1, self.wh * self.ww, c)

    def unpartition(self, t: torch.Tensor) -> torch.Tensor:
        """(B * nW, wh * ww) -> (B, H * W), dropping padding."""
        t = t.reshape(-1, self.nh, self.nw, self.wh, self.ww)
        t = t.permute(0, 1, 3, 2, 4).reshape(-1, self.nh * self.wh,
                                             self.nw * self.ww)
        return t[:, :self.h, :self.w].reshape(t.shape[0], -1)


@torch.no_grad()
def dpc_knn_assign(x: torch.Tensor, layout: WindowLayout, k: int = 5,
                   max_chunk_elems: int = 1 << 24) -> List[torch.Tensor]:
    """Cluster ids of every token per scale, numbered window-major.

    Args:
        x: (B, N, C) tokens of the grid described by ``layout``.
        layout: Windows and cluster counts (:class:`WindowLayout`).
        k: Neighbours of the kNN density (the token itself included).
        max_chunk_elems: Bound on the elements of one distance chunk.

    Returns:
        Per scale, (B, N) long ids in ``[0, layout.totals[s])``. Identity
        scales get ``arange(N)``.
    """
    b, n_tok, c = x.shape
    device = x.device
    identity = torch.arange(n_tok, device=device).expand(b, -1)
    todo = [s for s, ident in enumerate(layout.identity) if not ident]
    ids = [identity] * len(layout.identity)
    if not todo:
        return ids
    with torch.autocast(device.type, enabled=False):
        xw = layout.partition(x.float().reshape(b, layout.h, layout.w, c))
        nwin, n = layout.num_windows, xw.shape[1]
        valid = layout.valid.repeat(b, 1) if layout.padded else None
        counts = layout.counts[todo].repeat(1, b)  # (S, B * nW)
        chunk_rows = max(1, min(n, max_chunk_elems // n))
        group = max(1, max_chunk_elems // (chunk_rows * n))
        parts = [
            _dpc_knn_group(xw[g0:g0 + group],
                           None if valid is None else valid[g0:g0 + group],
                           counts[:, g0:g0 + group], k, chunk_rows)
            for g0 in range(0, xw.shape[0], group)
        ]
        local = torch.cat(parts, dim=1)  # (S, B * nW, n)
        for s, loc in zip(todo, local):
            offsets = layout.counts[s].cumsum(0) - layout.counts[s]
            glob = loc.reshape(b, nwin, n) + offsets[:, None]
            ids[s] = layout.unpartition(glob.reshape(b * nwin, n))
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
    visualisation; the default path stores nothing.

    Args:
        sr_ratio (int): Reduction ratio; coarse count = n // sr_ratio**2.
        scale_factors (Sequence[int]): Count multiplier of each scale.
            Default (1, 4), ClusTR's two scales.
        k (int): Neighbours of the kNN density. Default 5.
        window_size (int, optional): Clustering window side in tokens; None is
            exact mode (one window per image). Default None.
        max_chunk_elems (int): Largest distance chunk, in elements. Default
            2**24 (64 MB in fp32).
    """

    def __init__(self, sr_ratio: int, scale_factors: Sequence[int] = (1, 4),
                 k: int = 5, window_size: Optional[int] = None,
                 max_chunk_elems: int = 1 << 24):
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
        return WindowLayout(hw, self.window_size, self.sr_ratio,
                            self.scale_factors, device)

    def forward(self, x: torch.Tensor, w: torch.Tensor,
                hw: Tuple[int, int]) -> List[torch.Tensor]:
        """x: (B, N, C) tokens, w: (B, N, 1) weights -> per-scale (B, M, C)."""
        key = (tuple(hw), x.device)
        if self._layout is None or self._layout[0] != key:
            self._layout = (key, self.layout(hw, x.device))
        layout = self._layout[1]
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
        return [o.to(x.dtype) for o in out]

    def extra_repr(self) -> str:
        mode = ('exact' if self.window_size is None else
                f'window {self.window_size}')
        return (f'sr_ratio={self.sr_ratio}, scales={self.scale_factors}, '
                f'k={self.k}, {mode}')

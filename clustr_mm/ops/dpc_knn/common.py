"""What every part of the DPC-kNN clustering shares: the plan type, the
window layout of a token grid and the typed constants the backends read.

Nothing here reads token values: a :class:`WindowLayout` is built once per
grid size (by the reducer), its :class:`BatchConsts` once per batch size (by
the dispatch, :func:`~.dispatch.batch_consts`). Which plan each backend runs
with is the dispatch's decision (:func:`~.dispatch.default_plan`).
"""
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

# ClusTR's two nested scales: m = n // sr^2 clusters per window of n tokens,
# then 4 m (the paper's N / sr^2 and 4 N / sr^2).
CLUSTR_SCALES = (1, 4)


class ClusteringPlan(NamedTuple):
    """Which backend clusters and how the work is laid out for it.

    Every plan computes the same clusters (tested); plans differ only in
    speed and memory. ``max_chunk_elems`` bounds one distance block;
    ``pad_windows`` pads border windows into one batched call (fewer
    launches) instead of clustering each window shape unpadded in its own
    call (less work); ``blocked_knn`` finds the k nearest among the blocks
    of 64 columns with the smallest minima (fewer comparisons, more ops);
    ``kernel`` is the backend's ``NAME`` (:mod:`.dispatch`). ``precision``
    is the fused kernels' distance products, 'ieee' or 'tf32x3' (the
    reducer's ``precision`` sets it); the other backends are IEEE fp32
    whatever it says.
    """
    max_chunk_elems: int
    pad_windows: bool
    blocked_knn: bool
    kernel: str = 'blocked'
    precision: str = 'ieee'


# The largest distance block of the plans for accelerators (1 GiB fp32).
BLOCK_BUDGET = 1 << 28


class Task(NamedTuple):
    """What a backend is asked to cluster, as far as sizes tell (no token
    values are read): each backend's ``why_not(task)`` answers from it.
    ``device`` None is the CPU; ``dtype`` that of the tokens as clustered
    (the reducer clusters in fp32); ``k`` the density's neighbours;
    ``scales`` the scales clustered in one call."""
    device: Optional[torch.device] = None
    dtype: torch.dtype = torch.float32
    k: int = 5
    scales: int = 2


@dataclass(frozen=True)
class Padding:
    """The padding of G windows brought to one shape (border windows).

    ``invalid`` (G, n) is True at padded positions; ``knn_scale`` (G, 1)
    rescales the kNN mean of windows with fewer than k real tokens, None
    when every window has at least k.
    """
    invalid: torch.Tensor
    knn_scale: Optional[torch.Tensor]


@dataclass(frozen=True)
class Windows:
    """G same-shaped windows of n token slots: what a backend reads besides
    the tokens.

    ``ones`` (G, n, 1), ``positions`` ``arange(n)`` and ``inf`` (0-dim +inf)
    are cached tensors, for the reference and blocked backends (None where
    the fused kernels run: they read only the padding and center slots). ``padding``: None when no window is padded.
    ``center_slots`` (S, G, K): which of the K center slots are centers of
    each scale; None when there is one scale and every window has the same
    count (its first ``counts[0]`` slots).
    """
    ones: torch.Tensor
    positions: torch.Tensor
    inf: torch.Tensor
    padding: Optional[Padding] = None
    center_slots: Optional[torch.Tensor] = None

    @property
    def invalid(self) -> Optional[torch.Tensor]:
        """(G, n) True at padded positions; None without padding."""
        return None if self.padding is None else self.padding.invalid

    @property
    def knn_scale(self) -> Optional[torch.Tensor]:
        """(G, 1) kNN-mean rescale of short windows, or None."""
        return None if self.padding is None else self.padding.knn_scale


@dataclass(frozen=True)
class GroupConsts:
    """One window group for one batch size: its :class:`Windows` and
    ``offsets`` (S', 1, windows, 1), the id of each window's first cluster
    per clustered scale."""
    windows: Windows
    offsets: torch.Tensor


@dataclass(frozen=True)
class BatchConsts:
    """A layout's constants for one batch size: one :class:`GroupConsts`
    per window group; for the merge (:mod:`.merge`), ``merge_rows``
    (S', B, 1) (:func:`~.dispatch.merge_rows`), ``identity_rows`` (1, B * N),
    the tokens' own rows after the clustered scales' (None without an
    identity scale), and ``merge_zeros`` (rows, C + 1)."""
    groups: Tuple[GroupConsts, ...]
    merge_rows: torch.Tensor
    identity_rows: Optional[torch.Tensor]
    merge_zeros: torch.Tensor


class ClusterIds(NamedTuple):
    """The cluster of every token, per scale.

    ``scales``: per scale (B, N) long ids in ``[0, totals[s])``, numbered
    window by window (row-major), by center score inside a window;
    ``arange(N)`` for identity scales. ``clustered``: the clustered scales'
    ids stacked (S', B, N) (what the merge scatters with), None when no
    scale is clustered. ``consts``: the layout's :class:`BatchConsts` the
    ids were assigned with (the merge's rows), None when no scale is
    clustered.
    """
    scales: List[torch.Tensor]
    clustered: Optional[torch.Tensor]
    consts: Optional[BatchConsts] = None


class WindowGroup(NamedTuple):
    """Windows of one shape, clustered together in one batched call.

    ``rows``/``cols``: the [start, stop) of the token grid it covers;
    ``window``: (h, w) of each window, padding included; ``grid``: windows
    per column and row; ``pad``: rows and columns of zero padding added at
    the bottom and right; ``index``: the layout's (row-major) numbers of its
    windows; ``counts``: per scale, the most clusters any of them gets.
    """
    rows: Tuple[int, int]
    cols: Tuple[int, int]
    window: Tuple[int, int]
    grid: Tuple[int, int]
    pad: Tuple[int, int]
    index: List[int]
    counts: List[int]


def concat_chunks(parts: List[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Chunks back together (no copy for a single chunk)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def window_tokens(hw: Tuple[int, int], window_size: Optional[int]
                  ) -> List[int]:
    """Real tokens of each window of an ``hw`` grid, row-major."""
    h, w = hw
    size = window_size or max(h, w)
    wh, ww = min(size, h), min(size, w)
    return [min(wh, h - i * wh) * min(ww, w - j * ww)
            for i in range(-(-h // wh)) for j in range(-(-w // ww))]


def cluster_counts(tokens: Sequence[int], sr_ratio: int,
                   scale_factors: Sequence[int]) -> List[List[int]]:
    """Per scale, the clusters of each window of ``tokens`` tokens:
    ``min(f * max(1, n // sr_ratio**2), n)``."""
    return [[min(f * max(1, n // sr_ratio**2), n) for n in tokens]
            for f in scale_factors]


def _bands(length: int, size: int) -> List[Tuple[int, int, int, int]]:
    """(start, stop, window size, first window) of the full windows along an
    axis, then of the border window if ``size`` does not divide it."""
    full = length // size
    bands = [(0, full * size, size, 0)]
    if full * size < length:
        bands.append((full * size, length, length - full * size, full))
    return bands


class WindowLayout:
    """How a stage's token grid is tiled by clustering windows.

    Built once per grid size and plan (by the reducer); everything a
    forward pass needs besides the tokens is precomputed here, on
    ``device``.

    Args:
        hw: (H, W) of the token grid.
        window_size: Window side in tokens; None covers the grid with one.
        sr_ratio: Reduction ratio r of the stage (coarse count n // r^2).
        scale_factors: Cluster count multipliers of the scales.
        device: Device of the precomputed tensors.
        k: Neighbours of the kNN density (windows with fewer tokens get a
            rescaled mean).
        plan: The :class:`ClusteringPlan` (the dispatch's choice for the
            device, :func:`~.dispatch.choose_backend`).

    Attributes:
        window: (h, w) of a full window; grid: windows per (column, row).
        tokens: Real (unpadded) tokens of each window, row-major.
        counts: Per scale, the clusters of each window.
        totals: Number of clusters per scale.
        identity: Per scale, whether every token is its own cluster.
        num_scales: The number of scales (clustered or not).
        clustered: The scales that are not the identity (in order).
        offsets: (S, nWin) id of each window's first cluster, per scale.
        groups: The :class:`WindowGroup` calls: one (border windows padded)
            or, without ``plan.pad_windows``, one per window shape (up to 4).
    """

    def __init__(self, hw: Tuple[int, int], window_size: Optional[int],
                 sr_ratio: int, scale_factors: Sequence[int] = CLUSTR_SCALES,
                 device: Optional[torch.device] = None, k: int = 5, *,
                 plan: ClusteringPlan):
        # int(): under torch.jit.trace sizes arrive as 0-dim tensors.
        self.hw = (h, w) = (int(hw[0]), int(hw[1]))
        size = window_size or max(h, w)
        self.window = (wh, ww) = (min(size, h), min(size, w))
        self.grid = (gh, gw) = (-(-h // wh), -(-w // ww))
        self.device, self.k, self.plan = device, k, plan
        # what the layout was made from (the merge op is handed these)
        self.window_size, self.sr_ratio = window_size, sr_ratio
        self.scale_factors = tuple(scale_factors)
        self.tokens = window_tokens(self.hw, window_size)
        self.counts = cluster_counts(self.tokens, sr_ratio, scale_factors)
        self.totals = [sum(c) for c in self.counts]
        self.identity = [c == self.tokens for c in self.counts]
        self.num_scales = len(self.counts)
        self.clustered = [s for s, ident in enumerate(self.identity)
                          if not ident]
        offsets = [[sum(c[:i]) for i in range(len(c))] for c in self.counts]
        self.offsets = torch.tensor(offsets, dtype=torch.long, device=device)
        if plan.pad_windows:
            bands = ([(0, h, wh, 0)], [(0, w, ww, 0)])
        else:
            bands = (_bands(h, wh), _bands(w, ww))
        self.groups = []
        for r0, r1, sh, i0 in bands[0]:
            for c0, c1, sw, j0 in bands[1]:
                grid = (-(-(r1 - r0) // sh), -(-(c1 - c0) // sw))
                index = [(i0 + i) * gw + j0 + j for i in range(grid[0])
                         for j in range(grid[1])]
                self.groups.append(WindowGroup(
                    (r0, r1), (c0, c1), (sh, sw), grid,
                    (grid[0] * sh - (r1 - r0), grid[1] * sw - (c1 - c0)),
                    index, [max(c[i] for i in index) for c in self.counts]))
        # Token t of the grid sits at flat position token_pos[t] of the
        # groups' outputs (each (windows x window tokens), concatenated);
        # None when that is the identity.
        slot = torch.empty(h, w, dtype=torch.long, device=device)
        base = 0
        for grp in self.groups:
            (r0, r1), (c0, c1), (sh, sw) = grp.rows, grp.cols, grp.window
            r = torch.arange(r1 - r0, device=device)[:, None]
            c = torch.arange(c1 - c0, device=device)[None]
            slot[r0:r1, c0:c1] = base + ((r // sh) * grp.grid[1] + c // sw) * (
                sh * sw) + (r % sh) * sw + c % sw
            base += len(grp.index) * sh * sw
        self.token_pos = None if gh * gw == 1 else slot.flatten()
        self.token_ids = torch.arange(h * w, device=device)
        # per (batch, channels): the BatchConsts the dispatch makes
        # (dispatch.batch_consts), kept with the layout they belong to
        self.batches: Dict[Tuple[int, int], BatchConsts] = {}

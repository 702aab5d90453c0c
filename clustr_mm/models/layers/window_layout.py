"""Size-only set-up of the DPC-kNN clustering (``token_clustering``).

How a stage's token grid is cut into clustering windows, how that work is
laid out on each kind of device (:class:`ClusteringPlan`), and the constants
a forward pass needs besides the tokens (masks, cluster counts and id
offsets, the token order), built once per grid size and batch size and kept
on the device. Nothing here reads token values.
"""
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from .graph_safety import is_tracing


class ClusteringPlan(NamedTuple):
    """How the clustering is laid out on one kind of device.

    Every plan computes the same clusters (tested); plans differ only in
    speed and memory. ``max_chunk_elems`` bounds one distance block;
    ``pad_windows`` pads border windows into one batched call (fewer
    launches) instead of clustering each window shape unpadded in its own
    call (less work); ``blocked_knn`` finds the k nearest among the blocks
    of 64 columns with the smallest minima (fewer comparisons, more ops);
    ``kernel`` is the implementation (``token_clustering``): 'blocked',
    'reference' or 'fused'. ``precision`` is the fused kernels' distance
    products, 'ieee' or the opt-in 'tf32x3' (the reducer's ``precision``
    sets it); the other implementations are IEEE fp32 whatever it says.
    """
    max_chunk_elems: int
    pad_windows: bool
    blocked_knn: bool
    kernel: str = 'blocked'
    precision: str = 'ieee'


# GPUs without Triton: launches and host round trips are what cost, so one
# block of up to 1 GiB fp32 and one padded call per stage (batch 2 at
# 800 x 1344: stage 1 in two blocks). CPUs: work and cache misses are what
# cost, so 4 MB blocks that stay in cache, no padded work and the blocked kNN
# (faster on CPUs than the accelerator plan: docs/benchmarks.md).
ACCELERATOR_PLAN = ClusteringPlan(1 << 28, True, False)
CPU_PLAN = ClusteringPlan(1 << 20, False, True)
# CUDA with Triton: one fused op per window group, border windows padded.
FUSED_PLAN = ClusteringPlan(1 << 28, True, False, 'fused')
# Under torch.jit.trace (FLOP counters, export): the reference, unpadded, so
# the traced GEMMs are exactly the algorithm's.
TRACE_PLAN = ClusteringPlan(1 << 28, False, False, 'reference')


def plan_for(device: Optional[torch.device]) -> ClusteringPlan:
    """The plan of ``device`` (None: the CPU) and what is installed; the
    trace plan while ``torch.jit.trace`` runs."""
    if torch.jit.is_tracing():
        return TRACE_PLAN
    if device is None or device.type == 'cpu':
        return CPU_PLAN
    if device.type == 'cuda':
        from .fused_support import fused_available
        if fused_available():
            return FUSED_PLAN
    return ACCELERATOR_PLAN


class WindowBatch(NamedTuple):
    """Constants of one window group for one batch size, built once.

    Leading dim G = B x windows of the group: ``invalid`` (G, n) marks
    padding; ``knn_scale`` (G, 1) rescales the kNN mean of windows with fewer
    than k tokens; ``ones`` (G, n, 1). ``center_valid`` (S, G, K) marks which
    of the K center slots are centers of each scale. ``positions`` is
    ``arange(n)``; ``offsets`` (S, 1, windows, 1) the id of each window's
    first cluster (None inside the fused op, which does not offset ids);
    ``inf`` is a 0-dim +inf. Optional entries are None where not needed.
    """
    invalid: Optional[torch.Tensor]
    knn_scale: Optional[torch.Tensor]
    ones: torch.Tensor
    center_valid: Optional[torch.Tensor]
    positions: torch.Tensor
    offsets: Optional[torch.Tensor]
    inf: torch.Tensor

    def windows(self, sl: slice) -> 'WindowBatch':
        """The constants of windows ``sl`` (for one block of them)."""
        if sl == slice(0, None):
            return self

        def cut(t, dim=0):
            return None if t is None else t[sl] if dim == 0 else t[:, sl]
        # the constructor, not _replace: dynamo of torch 2.1 cannot inline it
        return WindowBatch(cut(self.invalid), cut(self.knn_scale),
                           cut(self.ones), cut(self.center_valid, 1),
                           *self[4:])


class LayoutBatch(NamedTuple):
    """A layout's constants for one batch size: one :class:`WindowBatch`
    per window group, and ``merge_rows`` (S, B, 1) and ``merge_zeros``
    (rows, C + 1) for ``token_clustering._cluster_sums``."""
    groups: Tuple[WindowBatch, ...]
    merge_rows: torch.Tensor
    merge_zeros: torch.Tensor


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

    Built once per grid size and plan (by
    :class:`~.token_clustering.DPCKNNClustering`);
    everything a forward pass needs besides the tokens is precomputed here,
    on ``device``.

    Args:
        hw: (H, W) of the token grid.
        window_size: Window side in tokens; None covers the grid with one.
        sr_ratio: Reduction ratio r of the stage (coarse count n // r^2).
        scale_factors: Cluster count multipliers of the scales.
        device: Device of the precomputed tensors.
        k: Neighbours of the kNN density (windows with fewer tokens get a
            rescaled mean).
        plan: :class:`ClusteringPlan`; None: :func:`plan_for` ``device``.

    Attributes:
        window: (h, w) of a full window; grid: windows per (column, row).
        tokens: Real (unpadded) tokens of each window, row-major.
        counts: Per scale, the clusters of each window.
        totals: Number of clusters per scale.
        identity: Per scale, whether every token is its own cluster.
        clustered: The scales that are not the identity (in order).
        offsets: (S, nWin) id of each window's first cluster, per scale.
        groups: The :class:`WindowGroup` calls: one (border windows padded)
            or, without ``plan.pad_windows``, one per window shape (up to 4).
    """

    def __init__(self, hw: Tuple[int, int], window_size: Optional[int],
                 sr_ratio: int, scale_factors: Sequence[int] = (1, 4),
                 device: Optional[torch.device] = None, k: int = 5,
                 plan: Optional[ClusteringPlan] = None):
        # int(): under torch.jit.trace sizes arrive as 0-dim tensors.
        self.hw = (h, w) = (int(hw[0]), int(hw[1]))
        size = window_size or max(h, w)
        self.window = (wh, ww) = (min(size, h), min(size, w))
        self.grid = (gh, gw) = (-(-h // wh), -(-w // ww))
        self.device, self.k = device, k
        self.plan = plan or plan_for(device)
        self.tokens = [min(wh, h - i * wh) * min(ww, w - j * ww)
                       for i in range(gh) for j in range(gw)]
        self.counts = []
        for f in scale_factors:
            self.counts.append([min(f * max(1, n // sr_ratio**2), n)
                                for n in self.tokens])
        self.totals = [sum(c) for c in self.counts]
        self.identity = [c == self.tokens for c in self.counts]
        self.clustered = [s for s, ident in enumerate(self.identity)
                          if not ident]
        offsets = [[sum(c[:i]) for i in range(len(c))] for c in self.counts]
        self.offsets = torch.tensor(offsets, dtype=torch.long, device=device)
        if self.plan.pad_windows:
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
        self._batches: Dict[Tuple[int, int], LayoutBatch] = {}

    def window_batch(self, batch: int, channels: int) -> LayoutBatch:
        """Constants for ``batch`` images of ``channels``, for the
        :attr:`clustered` scales."""
        key = (batch, channels)
        if key in self._batches:
            return self._batches[key]
        dev = self.device
        inf = torch.tensor(float('inf'), device=dev)
        groups = tuple(self._group_batch(grp, batch, inf)
                       for grp in self.groups)
        totals = [self.totals[s] for s in self.clustered]
        consts = LayoutBatch(
            groups, merge_rows(batch, totals, dev),
            torch.zeros(batch * sum(totals), channels + 1, device=dev))
        if not is_tracing():
            self._batches[key] = consts
        return consts

    def _group_batch(self, grp: WindowGroup, batch: int,
                     inf: torch.Tensor) -> WindowBatch:
        (sh, sw), (gh, gw) = grp.window, grp.grid
        (r0, r1), (c0, c1) = grp.rows, grp.cols
        todo = self.clustered
        dev, n = self.device, sh * sw
        positions = torch.arange(n, device=dev)
        invalid = knn_scale = center_valid = None
        if any(grp.pad):
            r = torch.arange(gh, device=dev)[:, None] * sh + torch.arange(
                sh, device=dev)
            c = torch.arange(gw, device=dev)[:, None] * sw + torch.arange(
                sw, device=dev)
            invalid = ~((r < r1 - r0)[:, None, :, None] &
                        (c < c1 - c0)[None, :, None, :])
            invalid = invalid.reshape(gh * gw, n).repeat(batch, 1)
            tokens = [self.tokens[i] for i in grp.index]
            k_eff = min(self.k, n)
            if min(tokens) < k_eff:
                knn_scale = torch.tensor(
                    [k_eff / min(k_eff, t) for t in tokens],
                    device=dev).repeat(batch)[:, None]
        counts = [[self.counts[s][i] for i in grp.index] for s in todo]
        if len(counts) > 1 or len(set(counts[0])) > 1:
            num = max(max(c) for c in counts)
            cnt = torch.tensor(counts, device=dev)  # (S, windows)
            center_valid = (positions[:num] < cnt[..., None]).repeat(
                1, batch, 1)
        offsets = self.offsets[list(todo)][:, grp.index][:, None, :, None]
        return WindowBatch(invalid, knn_scale,
                           torch.ones(batch * gh * gw, n, 1, device=dev),
                           center_valid, positions, offsets, inf)


def merge_rows(batch: int, totals: Sequence[int],
               device: Optional[torch.device] = None) -> torch.Tensor:
    """(S, B, 1) row of cluster 0 of image b in scale s of
    ``token_clustering._cluster_sums``:
    earlier scales' rows + b * totals[s], so one scatter fills every scale."""
    starts = [batch * sum(totals[:t]) for t in range(len(totals))]
    return (torch.tensor(starts, device=device)[:, None] +
            torch.tensor(totals, device=device)[:, None] *
            torch.arange(batch, device=device))[..., None]

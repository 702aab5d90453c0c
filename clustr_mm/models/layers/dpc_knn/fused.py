"""The fused backend: DPC-kNN as one custom op, with Triton kernels that
never write the distance block (the remedy FlashAttention made for
attention).

* Pass 1 (:func:`_knn_kernel`): each row block scans every column tile,
  its own first, and keeps its rows' k smallest squared distances (self
  included), largest distance to a real token and first near-duplicate. A
  tile gives up only as many smallest values as its row with the most
  entries under that row's current k-th nearest has, so after the first
  tiles most give up none or one (the k-nearest selection, not the distance
  products, was what pass 1 spent its time on; docs/benchmarks.md). It
  computes each distance in both orientations, bitwise equal with IEEE
  products (one FMA chain per entry over the channels in order; a*b and
  sq_i + sq_j commute); with 'tf32x3' they may differ by round-off within
  the tie threshold.
* Pass 2 (:func:`_denser_kernel`): rows and columns in density order, so a
  row block scans only the columns before it (the denser tokens): the
  smallest squared distance to a denser token.
* Pass 3, the nearest center, is small (n x K) and runs in torch, as do the
  steps between the passes (:mod:`.reference`).

Distances are fp32 with IEEE products by default (``input_precision='ieee'``:
never TF32), ``|a|^2 + |b|^2 - 2 a.b`` like the other backends, ties
broken alike (:mod:`.reference`). ``precision='tf32x3'`` (opt in) makes the
kernels' products 3xTF32 on tensor cores (hi*hi + hi*lo + lo*hi, tf32
halves of each fp32 operand) with the tie threshold of that precision
(:func:`~.reference.tie_tolerance`); pass 3 stays IEEE fp32. Padded
positions are infinitely far and least dense. The whole clustering of a
window group is the op ``torch.ops.clustr_mm.dpc_knn``
(``torch.library.custom_op``, torch >= 2.4):
``torch.compile(fullgraph=True)``, CUDA graphs and the op census see one op;
it has a fake implementation for shapes and a FLOP formula.

The dispatch chooses this backend by itself only for CUDA tensors with
Triton and ``custom_op`` (:func:`why_not`). A plan that names it (e.g. the
op census counting the CUDA path on a CPU) runs the op anywhere: on tensors
that are not on CUDA the op computes with the blocked backend under
:data:`~.common.FUSED_PLAN`, unless Triton's interpreter is on
(``TRITON_INTERPRET=1`` before this module is imported), which runs the
kernels on the CPU for tests.
"""
import functools
import os
from typing import List, Optional, Sequence

import torch

from . import blocked
from .common import FUSED_PLAN, ClusteringPlan, Padding, Windows
from .reference import (augment, centers_by_score, check_precision, density,
                        gather_columns, nearest_center, record)

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only builds of torch, or no triton
    triton = tl = None

NAME = 'fused'
HAS_CUSTOM_OP = hasattr(torch.library, 'custom_op')
# Triton's interpreter runs the kernels on the CPU (tests); it must be on
# before the kernels are defined.
INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'

# Tiles: BLOCK x BLOCK distances, BLOCK_C channels per product step.
BLOCK, BLOCK_C = 64, 16
# Warps per kernel. Pass 1 on an H200 (sm_90) at ClusTR-S's stage 1 took
# 19 ms (ieee) / 6 ms (tf32x3) at 4 warps, 31 / 16 at 8 and 33 / 22 at 16
# (docs/benchmarks.md); at 4 it has 255 registers and no spills there, but
# spills on sm_80, which gets 8 (no spills; its speed is not measured).
KNN_WARPS_SM90, KNN_WARPS_OTHER, DENSER_WARPS = 4, 8, 8


if triton is not None:

    @triton.jit
    def _distance_tile(x_ptr, sq_ptr, ok_ptr, base, rows, cols, n, C,
                       BLOCK_C: tl.constexpr, PRECISION: tl.constexpr):
        """(BM, BN) squared distances of tokens ``rows`` and ``cols``
        (positions in the window starting at ``base``): +inf where either
        is padding or out of range, 0 on the diagonal; products in
        ``PRECISION`` ('ieee' or 'tf32x3')."""
        rmask, cmask = rows < n, cols < n
        acc = tl.zeros((rows.shape[0], cols.shape[0]), tl.float32)
        for c0 in range(0, C, BLOCK_C):
            ch = c0 + tl.arange(0, BLOCK_C)
            a = tl.load(x_ptr + (base + rows)[:, None] * C + ch[None, :],
                        mask=rmask[:, None] & (ch[None, :] < C), other=0.0)
            b = tl.load(x_ptr + (base + cols)[None, :] * C + ch[:, None],
                        mask=cmask[None, :] & (ch[:, None] < C), other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PRECISION)
        sq_r = tl.load(sq_ptr + base + rows, mask=rmask, other=0.0)
        sq_c = tl.load(sq_ptr + base + cols, mask=cmask, other=0.0)
        ok_r = tl.load(ok_ptr + base + rows, mask=rmask, other=0) != 0
        ok_c = tl.load(ok_ptr + base + cols, mask=cmask, other=0) != 0
        d = sq_r[:, None] + sq_c[None, :] - 2.0 * acc
        d = tl.where(ok_r[:, None] & ok_c[None, :], d, float('inf'))
        return tl.where(rows[:, None] == cols[None, :], 0.0, d)

    @triton.jit
    def _keep(best, v, slot):
        """Put ``v`` (B,) in place of each row's largest value in ``best``
        (B, KP) where it is smaller."""
        worst, at = tl.max(best, axis=1, return_indices=True)
        return tl.where((slot[None, :] == at[:, None]) & (v < worst)[:, None],
                        v[:, None], best)

    @triton.jit
    def _no_results(BLOCK: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                    n):
        """Empty results of :func:`_knn_kernel` for BLOCK tokens; slots past K
        hold -inf, so they are never the largest kept value."""
        slot = tl.arange(0, KP)
        best = tl.where(slot[None, :] < K,
                        tl.full((BLOCK, KP), float('inf'), tl.float32),
                        float('-inf'))
        return (best, tl.zeros((BLOCK, ), tl.float32),
                tl.full((BLOCK, ), n, tl.int32))

    @triton.jit
    def _store_results(knn_ptr, rowmax_ptr, first_ptr, base, rows, best,
                       top, first, n, K: tl.constexpr):
        """Write the K kept values of each row ascending (like topk), its
        largest distance and first duplicate."""
        rmask = rows < n
        slot = tl.arange(0, best.shape[1])
        best = tl.where(slot[None, :] < K, best, float('inf'))
        for j in tl.static_range(K):
            v, at = tl.min(best, axis=1, return_indices=True)
            tl.store(knn_ptr + (base + rows) * K + j, v, mask=rmask)
            best = tl.where(slot[None, :] == at[:, None], float('inf'), best)
        tl.store(rowmax_ptr + base + rows, top, mask=rmask)
        tl.store(first_ptr + base + rows, first, mask=rmask)

    @triton.jit
    def _knn_kernel(x_ptr, sq_ptr, ok_ptr, tie_ptr, knn_ptr, rowmax_ptr,
                    first_ptr, n, C, K: tl.constexpr, KP: tl.constexpr,
                    BLOCK: tl.constexpr, BLOCK_C: tl.constexpr,
                    PRECISION: tl.constexpr):
        """Pass 1: row block I folds every tile (I, J), its own first (in
        raster order its neighbours fill the k nearest early), into its
        rows' K smallest squared distances (ascending; +inf past a window's
        tokens), largest distance to a real token (0 at least) and first
        column within the tie threshold. From a tile it pops only as many
        smallest values as the row with the most entries under its current
        K-th nearest has (at most K): the others could not enter, so the K
        kept are exactly those of folding all of them. Grid: (windows, row
        blocks)."""
        g = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1)
        lane = tl.arange(0, BLOCK)
        slot = tl.arange(0, KP)
        rows = blk * BLOCK + lane
        base = g * n
        tie = tl.load(tie_ptr + base + rows, mask=rows < n, other=0.0)
        best, top, first = _no_results(BLOCK, K, KP, n)
        tiles = tl.cdiv(n, BLOCK)
        for j in range(0, tiles):
            cols = ((blk + j) % tiles) * BLOCK + lane
            d = _distance_tile(x_ptr, sq_ptr, ok_ptr, base, rows, cols, n,
                               C, BLOCK_C, PRECISION)
            near = d <= tie[:, None]
            first = tl.minimum(first,
                               tl.min(tl.where(near, cols[None, :], n), 1))
            top = tl.maximum(top, tl.max(tl.where(d < float('inf'), d, 0.0),
                                         1))
            worst = tl.max(best, axis=1)
            under = tl.sum((d < worst[:, None]).to(tl.int32), axis=1)
            pops = tl.minimum(tl.max(under, axis=0), K)
            for _ in range(pops):
                v, at = tl.min(d, axis=1, return_indices=True)
                d = tl.where(lane[None, :] == at[:, None], float('inf'), d)
                best = _keep(best, v, slot)
        _store_results(knn_ptr, rowmax_ptr, first_ptr, base, rows, best, top,
                       first, n, K)

    @triton.jit
    def _denser_kernel(xo_ptr, sqo_ptr, oko_ptr, out_ptr, n, C,
                       BLOCK: tl.constexpr, BLOCK_C: tl.constexpr,
                       PRECISION: tl.constexpr):
        """Pass 2, on tokens in density order: each row's smallest squared
        distance to an earlier (denser) token; +inf for the first. Grid:
        (windows, row blocks)."""
        g = tl.program_id(0)
        start = tl.program_id(1) * BLOCK
        lane = tl.arange(0, BLOCK)
        rows = start + lane
        base = g * n
        nearest = tl.full((BLOCK, ), float('inf'), tl.float32)
        for c0 in range(0, start + BLOCK, BLOCK):
            cols = c0 + lane
            d = _distance_tile(xo_ptr, sqo_ptr, oko_ptr, base, rows, cols, n,
                               C, BLOCK_C, PRECISION)
            d = tl.where(cols[None, :] < rows[:, None], d, float('inf'))
            nearest = tl.minimum(nearest, tl.min(d, axis=1))
        tl.store(out_ptr + base + rows, nearest, mask=rows < n)


@functools.lru_cache(maxsize=None)
def knn_warps(device: torch.device) -> int:
    """Warps of pass 1 on ``device`` (by compute capability)."""
    if device.type != 'cuda':  # Triton's interpreter
        return KNN_WARPS_SM90
    major, _ = torch.cuda.get_device_capability(device)
    return KNN_WARPS_SM90 if major >= 9 else KNN_WARPS_OTHER


def _knn_pass(x: torch.Tensor, sq: torch.Tensor, ok: torch.Tensor,
              tie: torch.Tensor, k: int, precision: str):
    """Pass 1 on (G, n, C) tokens: (G, n, k) k smallest squared distances
    ascending, (G, n) largest distance to a real token, (G, n) int32 first
    column within the tie threshold."""
    g, n, c = x.shape
    knn_d = x.new_empty(g, n, k)
    rowmax = x.new_empty(g, n)
    first = torch.empty(g, n, dtype=torch.int32, device=x.device)
    _knn_kernel[(g, triton.cdiv(n, BLOCK))](
        x, sq, ok, tie, knn_d, rowmax, first, n, c, K=k,
        KP=triton.next_power_of_2(k), BLOCK=BLOCK, BLOCK_C=BLOCK_C,
        PRECISION=precision, num_warps=knn_warps(x.device))
    return knn_d, rowmax, first


def _triton_passes(x: torch.Tensor, counts: Sequence[int], k: int,
                   windows: Windows, precision: str,
                   probe: Optional[dict] = None) -> torch.Tensor:
    """The fused implementation: kernels for passes 1 and 2, torch between
    and for the nearest center (``probe``: as
    :func:`~.reference.dpc_knn_reference`'s)."""
    g, n, c = x.shape
    x = x.contiguous()
    rows_aug, cols_aug, tie = augment(x, windows.ones, windows.invalid,
                                      precision)
    sq = x.pow(2).sum(-1)
    ok = (torch.ones_like(sq, dtype=torch.int8) if windows.invalid is None
          else (~windows.invalid).to(torch.int8))
    knn_d, rowmax, first = _knn_pass(x, sq, ok, tie, min(k, n), precision)
    record(probe, knn=knn_d)
    rho = density(knn_d, tie, c, windows, first.long())
    order = torch.sort(rho, dim=1, descending=True, stable=True).indices
    xo = x.gather(1, order[..., None].expand(-1, -1, c))
    by_order = x.new_empty(g, n)
    _denser_kernel[(g, triton.cdiv(n, BLOCK))](
        xo, sq.gather(1, order), ok.gather(1, order), by_order, n, c,
        BLOCK=BLOCK, BLOCK_C=BLOCK_C, PRECISION=precision,
        num_warps=DENSER_WARPS)
    delta2 = torch.empty_like(by_order).scatter_(1, order, by_order)
    dmax2 = rowmax.amax(-1)
    centers = centers_by_score(rho, delta2, dmax2, tie, c, max(counts),
                               windows)
    record(probe, first=first.long(), rho=rho, delta2=delta2, dmax2=dmax2,
           centers=centers)
    dist = torch.bmm(rows_aug, gather_columns(cols_aug, centers))
    return nearest_center(dist, tie, centers, windows.positions, counts,
                          windows)


def runs_kernels(x: torch.Tensor) -> bool:
    """Whether the op runs the kernels on ``x`` (a CUDA tensor, or Triton's
    interpreter on); otherwise it runs the blocked backend."""
    return triton is not None and (x.is_cuda or INTERPRET)


def _dpc_knn(x: torch.Tensor, invalid: Optional[torch.Tensor],
             knn_scale: Optional[torch.Tensor],
             center_valid: Optional[torch.Tensor], counts: List[int],
             k: int, precision: str) -> torch.Tensor:
    g, n, _ = x.shape
    windows = Windows(x.new_ones(g, n, 1), torch.arange(n, device=x.device),
                      x.new_tensor(float('inf')),
                      None if invalid is None else Padding(invalid, knn_scale),
                      center_valid)
    if runs_kernels(x):
        return _triton_passes(x, counts, k, windows, precision)
    # where the kernels cannot run: the blocked backend (IEEE fp32 whatever
    # the precision asked for) under the fused plan's budget
    return blocked.run(x, counts, k, windows, FUSED_PLAN)


def dpc_knn_flops(g: int, n: int, c: int, centers: int) -> int:
    """FLOPs of the op (2 per multiply-add, ``torch.utils.flop_counter``'s
    convention), as the kernels compute them: pass 1 pairs every token with
    every token; pass 2 a row block starting at token s with tokens
    ..s + BLOCK (the denser ones, whole tiles); then the distances to the
    centers."""
    denser = sum(min(BLOCK, n - s) * min(n, s + BLOCK)
                 for s in range(0, n, BLOCK))
    return 2 * g * (c * (n * n + denser) + n * centers * (c + 2))


if HAS_CUSTOM_OP:
    _op = torch.library.custom_op('clustr_mm::dpc_knn',
                                  mutates_args=())(_dpc_knn)

    @_op.register_fake
    def _(x, invalid, knn_scale, center_valid, counts, k, precision):
        return x.new_empty((len(counts), x.shape[0], x.shape[1]),
                           dtype=torch.long)

    try:
        from torch.utils.flop_counter import register_flop_formula
    except ImportError:
        register_flop_formula = None
    if register_flop_formula is not None:

        @register_flop_formula(torch.ops.clustr_mm.dpc_knn)
        def _flops(x_shape, *args, out_shape=None, **kwargs):
            counts = args[3] if len(args) > 3 else kwargs['counts']
            g, n, c = x_shape
            return dpc_knn_flops(g, n, c, max(counts))


def why_not(device: Optional[torch.device]) -> Optional[str]:
    """Why the dispatch does not choose this backend on ``device`` (None:
    it does)."""
    reason = blocked.why_not(device)  # export or trace: the reference's
    if reason is not None:
        return reason
    if device is None or device.type != 'cuda':
        kind = 'cpu' if device is None else device.type
        return f'tensors on {kind}: the kernels run on CUDA'
    if triton is None:
        return 'triton is not installed'
    if not HAS_CUSTOM_OP:
        return 'torch.library.custom_op is missing (torch < 2.4)'
    if not torch.cuda.is_available():
        return 'CUDA is not available'
    return None


def run(x: torch.Tensor, counts: Sequence[int], k: int, windows: Windows,
        plan: ClusteringPlan) -> torch.Tensor:
    """The backend call (see :mod:`.dispatch`): :func:`dpc_knn_fused` in
    the plan's precision."""
    return dpc_knn_fused(x, counts, k, windows, plan.precision)


def dpc_knn_fused(x: torch.Tensor, counts: Sequence[int], k: int,
                  windows: Windows, precision: str = 'ieee') -> torch.Tensor:
    """(S, G, n) ids of G windows (as
    :func:`~.reference.dpc_knn_reference`) by the fused op, or by the same
    code called directly where torch has no ``custom_op``. ``precision``:
    the kernels' products, 'ieee' (exact fp32) or 'tf32x3' (see the module
    docstring); where the kernels do not run (no CUDA tensor, no
    interpreter) the blocked fp32 path runs and it has no effect."""
    check_precision(precision)
    run_op = torch.ops.clustr_mm.dpc_knn if HAS_CUSTOM_OP else _dpc_knn
    return run_op(x, windows.invalid, windows.knn_scale,
                  windows.center_slots, list(counts), k, precision)

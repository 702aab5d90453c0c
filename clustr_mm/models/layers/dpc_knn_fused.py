"""DPC-kNN as one custom op, with Triton kernels that never write the
distance block (the remedy FlashAttention made for attention).

* Pass 1 (:func:`_knn_kernel`): per row block, distance tiles over all
  columns, computed on chip; each row keeps its k smallest squared distances
  (self included) and its largest distance to a real token.
* Pass 2 (:func:`_denser_kernel`): rows and columns in density order, so a
  row block scans only the columns before it (the denser tokens): the
  smallest squared distance to a denser token.
* Pass 3, the nearest center, is small (n x K) and runs in torch, as do the
  steps between the passes (:mod:`~.dpc_knn`).

Distances are fp32 with IEEE products (``input_precision='ieee'``: never
TF32), ``|a|^2 + |b|^2 - 2 a.b`` like the other implementations, ties broken
alike (:mod:`~.dpc_knn`). Padded positions are infinitely far and least
dense. The whole clustering of a window group is the op
``torch.ops.clustr_mm.dpc_knn`` (``torch.library.custom_op``, torch >= 2.4):
``torch.compile(fullgraph=True)``, CUDA graphs and the op census see one op;
it has a fake implementation for shapes and a FLOP formula. On tensors that
are not on CUDA the op runs the blocked implementation, unless Triton's
interpreter is on (``TRITON_INTERPRET=1`` before this module is imported),
which runs the kernels on the CPU for tests.
"""
import os
from typing import List, NamedTuple, Optional, Sequence

import torch

from .dpc_knn import augment, centers_by_score, density, gather_columns
from .dpc_knn import nearest_center
from .dpc_knn_blocked import dpc_knn_blocked

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only builds of torch, or no triton
    triton = None

HAS_CUSTOM_OP = hasattr(torch.library, 'custom_op')
INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'
# Tiles: rows x columns of a distance tile, channels per product step.
BLOCK_M, BLOCK_N, BLOCK_C = 64, 64, 16
NUM_WARPS = 8


def fused_available() -> bool:
    """Whether the fused op can run on a CUDA device here."""
    return (triton is not None and HAS_CUSTOM_OP
            and torch.cuda.is_available())


if triton is not None:

    @triton.jit
    def _distance_tile(x_ptr, sq_ptr, ok_ptr, base, rows, cols, n, C,
                       BLOCK_C: tl.constexpr):
        """(BM, BN) squared distances of tokens ``rows`` and ``cols``
        (positions in the window starting at ``base``): +inf where either
        is padding or out of range, 0 on the diagonal."""
        rmask, cmask = rows < n, cols < n
        acc = tl.zeros((rows.shape[0], cols.shape[0]), tl.float32)
        for c0 in range(0, C, BLOCK_C):
            ch = c0 + tl.arange(0, BLOCK_C)
            a = tl.load(x_ptr + (base + rows)[:, None] * C + ch[None, :],
                        mask=rmask[:, None] & (ch[None, :] < C), other=0.0)
            b = tl.load(x_ptr + (base + cols)[None, :] * C + ch[:, None],
                        mask=cmask[None, :] & (ch[:, None] < C), other=0.0)
            acc = tl.dot(a, b, acc, input_precision='ieee')
        sq_r = tl.load(sq_ptr + base + rows, mask=rmask, other=0.0)
        sq_c = tl.load(sq_ptr + base + cols, mask=cmask, other=0.0)
        ok_r = tl.load(ok_ptr + base + rows, mask=rmask, other=0) != 0
        ok_c = tl.load(ok_ptr + base + cols, mask=cmask, other=0) != 0
        d = sq_r[:, None] + sq_c[None, :] - 2.0 * acc
        d = tl.where(ok_r[:, None] & ok_c[None, :], d, float('inf'))
        return tl.where(rows[:, None] == cols[None, :], 0.0, d)

    @triton.jit
    def _knn_kernel(x_ptr, sq_ptr, ok_ptr, tie_ptr, knn_ptr, rowmax_ptr,
                    first_ptr, n, C, K: tl.constexpr, KP: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
        """Pass 1: the K smallest squared distances of each row, ascending
        (+inf past a window's tokens), its largest one to a real token (0 at
        least) and its first column within the tie threshold. Grid:
        (windows, row blocks)."""
        g = tl.program_id(0)
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        base = g * n
        tie = tl.load(tie_ptr + base + rows, mask=rows < n, other=0.0)
        first = tl.full((BLOCK_M, ), n, tl.int32)
        slot = tl.arange(0, KP)
        # slots past K hold -inf, so they are never the largest kept value
        best = tl.where(slot[None, :] < K,
                        tl.full((BLOCK_M, KP), float('inf'), tl.float32),
                        float('-inf'))
        rowmax = tl.zeros((BLOCK_M, ), tl.float32)
        lane = tl.arange(0, BLOCK_N)
        for c0 in range(0, n, BLOCK_N):
            d = _distance_tile(x_ptr, sq_ptr, ok_ptr, base, rows, c0 + lane,
                               n, C, BLOCK_C)
            dup = tl.where(d <= tie[:, None], c0 + lane[None, :], n)
            first = tl.minimum(first, tl.min(dup, axis=1))
            finite = tl.where(d < float('inf'), d, 0.0)
            rowmax = tl.maximum(rowmax, tl.max(finite, axis=1))
            # move the tile's K smallest into the kept ones
            for _ in tl.static_range(K):
                v, at = tl.min(d, axis=1, return_indices=True)
                d = tl.where(lane[None, :] == at[:, None], float('inf'), d)
                worst, where = tl.max(best, axis=1, return_indices=True)
                best = tl.where((slot[None, :] == where[:, None]) &
                                (v < worst)[:, None], v[:, None], best)
        rmask = rows < n
        best = tl.where(slot[None, :] < K, best, float('inf'))
        for j in tl.static_range(K):  # written ascending, like topk
            v, at = tl.min(best, axis=1, return_indices=True)
            tl.store(knn_ptr + (base + rows) * K + j, v, mask=rmask)
            best = tl.where(slot[None, :] == at[:, None], float('inf'), best)
        tl.store(rowmax_ptr + base + rows, rowmax, mask=rmask)
        tl.store(first_ptr + base + rows, first, mask=rmask)

    @triton.jit
    def _denser_kernel(xo_ptr, sqo_ptr, oko_ptr, out_ptr, n, C,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_C: tl.constexpr):
        """Pass 2, on tokens in density order: each row's smallest squared
        distance to an earlier (denser) token; +inf for the first. Grid:
        (windows, row blocks)."""
        g = tl.program_id(0)
        start = tl.program_id(1) * BLOCK_M
        rows = start + tl.arange(0, BLOCK_M)
        base = g * n
        lane = tl.arange(0, BLOCK_N)
        nearest = tl.full((BLOCK_M, ), float('inf'), tl.float32)
        for c0 in range(0, start + BLOCK_M, BLOCK_N):
            cols = c0 + lane
            d = _distance_tile(xo_ptr, sqo_ptr, oko_ptr, base, rows, cols, n,
                               C, BLOCK_C)
            d = tl.where(cols[None, :] < rows[:, None], d, float('inf'))
            nearest = tl.minimum(nearest, tl.min(d, axis=1))
        tl.store(out_ptr + base + rows, nearest, mask=rows < n)


def _triton_passes(x: torch.Tensor, counts: Sequence[int], k: int,
                   consts) -> torch.Tensor:
    """The fused implementation: kernels for passes 1 and 2, torch between
    and for the nearest center."""
    g, n, c = x.shape
    k_eff = min(k, n)
    x = x.contiguous()
    rows_aug, cols_aug, tie = augment(x, consts.ones, consts.invalid)
    sq = x.pow(2).sum(-1)
    ok = (torch.ones_like(sq, dtype=torch.int8) if consts.invalid is None
          else (~consts.invalid).to(torch.int8))
    knn_d = x.new_empty(g, n, k_eff)
    rowmax = x.new_empty(g, n)
    first = torch.empty(g, n, dtype=torch.int32, device=x.device)
    grid = (g, triton.cdiv(n, BLOCK_M))
    _knn_kernel[grid](x, sq, ok, tie, knn_d, rowmax, first, n, c, K=k_eff,
                      KP=triton.next_power_of_2(k_eff), BLOCK_M=BLOCK_M,
                      BLOCK_N=BLOCK_N, BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
    rho = density(knn_d, tie, c, consts, first.long())
    order = torch.sort(rho, dim=1, descending=True, stable=True).indices
    xo = x.gather(1, order[..., None].expand(-1, -1, c))
    by_order = x.new_empty(g, n)
    _denser_kernel[grid](xo, sq.gather(1, order), ok.gather(1, order),
                         by_order, n, c, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                         BLOCK_C=BLOCK_C, num_warps=NUM_WARPS)
    delta2 = torch.empty_like(by_order).scatter_(1, order, by_order)
    centers = centers_by_score(rho, delta2, rowmax.amax(-1), tie, c,
                               max(counts), consts)
    dist = torch.bmm(rows_aug, gather_columns(cols_aug, centers))
    return nearest_center(dist, tie, centers, consts.positions, counts,
                          consts)


class _Windows(NamedTuple):
    """The window constants the implementations read (the fields of
    ``window_layout.WindowBatch`` they use), from the op's arguments."""
    invalid: Optional[torch.Tensor]
    knn_scale: Optional[torch.Tensor]
    ones: torch.Tensor
    center_valid: Optional[torch.Tensor]
    positions: torch.Tensor
    inf: torch.Tensor


def _windows(x, invalid, knn_scale, center_valid) -> _Windows:
    g, n, _ = x.shape
    return _Windows(invalid, knn_scale, x.new_ones(g, n, 1), center_valid,
                    torch.arange(n, device=x.device),
                    x.new_tensor(float('inf')))


def _dpc_knn(x: torch.Tensor, invalid: Optional[torch.Tensor],
             knn_scale: Optional[torch.Tensor],
             center_valid: Optional[torch.Tensor], counts: List[int],
             k: int) -> torch.Tensor:
    consts = _windows(x, invalid, knn_scale, center_valid)
    if triton is not None and (x.is_cuda or INTERPRET):
        return _triton_passes(x, counts, k, consts)
    return dpc_knn_blocked(x, counts, k, consts, 1 << 28, False)


def dpc_knn_flops(g: int, n: int, c: int, centers: int) -> int:
    """FLOPs of the op (2 per multiply-add, ``torch.utils.flop_counter``'s
    convention): all distances in pass 1, the denser half in pass 2 (and the
    diagonal), the distances to the centers."""
    return 2 * g * (c * (n * n + n * (n + 1) // 2) + n * centers * (c + 2))


if HAS_CUSTOM_OP:
    _op = torch.library.custom_op('clustr_mm::dpc_knn',
                                  mutates_args=())(_dpc_knn)

    @_op.register_fake
    def _(x, invalid, knn_scale, center_valid, counts, k):
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


def dpc_knn_fused(x: torch.Tensor, counts: Sequence[int], k: int,
                  consts) -> torch.Tensor:
    """(S, G, n) ids of G windows (as
    :func:`~.dpc_knn.dpc_knn_reference`) by the fused op, or by the same
    code called directly where torch has no ``custom_op``."""
    run = torch.ops.clustr_mm.dpc_knn if HAS_CUSTOM_OP else _dpc_knn
    return run(x, consts.invalid, consts.knn_scale, consts.center_valid,
               list(counts), k)

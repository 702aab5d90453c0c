"""The fused backend: DPC-kNN as one custom op, with Triton kernels that
never write the distance block (the remedy FlashAttention made for
attention).

Five launches of its own (one more pruned) and three of torch per call:

* :func:`_prep_kernel`: |x|^2 (+inf at padding, so every distance to or
  from a padded slot is +inf without a mask), the tie threshold and, for
  'tf32x3', the tf32 hi/lo halves of the tokens, once per call.
* Pass 1 (:func:`_knn_kernel`): each row block scans every column tile,
  its own first. The selection needs no work across threads inside the
  tile loop: every accumulator position (row, lane) keeps a sorted list of
  the k smallest distances it has seen (an insertion network of k min/max
  pairs, elementwise), its largest finite distance and its first column
  within the tie threshold; each row's k smallest are among the k smallest
  of its own lanes, so one reduction per row block after the loop gives
  exactly the row's k nearest. Its store computes the raw density
  ``exp(-mean / C)`` (ties snapped, short windows rescaled, padding -1).
* torch: the density of the first duplicate (one gather) and the density
  order (one stable sort).
* Pass 2 (:func:`_denser_kernel`): rows and columns in density order (read
  through the order, no copy of the tokens), a row block scans only the
  columns before it (the denser tokens), keeping an elementwise running
  minimum; its store writes the squared distance to the nearest denser
  token and the center score ``rho * sqrt(delta2 / C)`` (-inf at padding).
* Pruned (:attr:`KernelConfig.prune_denser`, on where a GPU measured
  it faster: :data:`MEASURED`): pass 1 also keeps, per accumulator
  position, the column of its smallest key, so it knows most rows'
  nearest other token (not where the row and that token share a lane).
  Where that token is denser it is the nearest denser one (nothing else
  is nearer), and :func:`_pending_kernel` (one program per window) writes
  its distance and score; pass 2 then scans only the other rows, gathered
  in density order. The same ids (those rows' distances are pass 1's
  evaluation of the same pair); 19-27 % of the rows scanned on ClusTR-S's
  random-weight stage tokens at 224 (docs/backbones.md;
  ``tools/analysis/clustering_speed.py`` measures it on a GPU beside the
  full scan).
* torch: the centers (one stable sort of the scores).
* :func:`_assign_kernel`: the nearest center of every token for every
  scale, ids written directly (no (G, n, K) block).

Distances are ``|a|^2 + |b|^2 - 2 a.b`` like the other backends, ties
broken alike (:mod:`.reference`). ``precision`` sets passes 1 and 2's
products: 'tf32x3' (the default for ClusTR: 3xTF32 on tensor cores,
hi*hi + hi*lo + lo*hi of the tf32 halves, with the tie threshold of that
precision, :func:`~.reference.tie_tolerance`) or 'ieee' (fp32 FMA products,
never TF32). The assignment's products are always IEEE fp32. Padded
positions are infinitely far and least dense. The whole clustering of a
window group is the op ``torch.ops.clustr_mm.dpc_knn``
(``torch.library.custom_op``, torch >= 2.4): ``torch.compile(
fullgraph=True)``, CUDA graphs and the op census see one op; it has a fake
implementation for shapes and a FLOP formula.

The dispatch chooses this backend by itself only for CUDA tensors with
Triton and ``custom_op`` (:func:`why_not`). A plan that names it (e.g. the
op census counting the CUDA path on a CPU) runs the op anywhere: on tensors
that are not on CUDA the op computes with the blocked backend under
:data:`~.dispatch.FUSED_PLAN`'s budget, unless Triton's interpreter is on
(``TRITON_INTERPRET=1`` before this module is imported), which runs the
kernels on the CPU for tests.
"""
import functools
import os
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

from . import blocked
from .common import BLOCK_BUDGET, ClusteringPlan, Padding, Task, Windows
from .reference import check_precision, record, tie_tolerance

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only builds of torch, or no triton
    triton = tl = None
try:  # exp correctly rounded on the GPU (tl.exp is ex2.approx there)
    from triton.language.extra import libdevice
except ImportError:
    libdevice = None

NAME = 'fused'
# keeps no distance block: the dispatch gives it a whole window group
HOLDS_BLOCKS = False
HAS_CUSTOM_OP = hasattr(torch.library, 'custom_op')
# Triton's interpreter runs the kernels on the CPU (tests); it must be on
# before the kernels are defined.
INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'

# Tiles: BLOCK rows (tokens), BLOCK_C channels per product step.
BLOCK, BLOCK_C = 64, 16
# Columns per tile of pass 1: it keeps k + 2 (BLOCK, KNN_BLOCK_N) tensors
# in registers (16 registers each a thread at 4 warps), so k <= MAX_K.
KNN_BLOCK_N, MAX_K = 32, 8
# Scales the assignment kernel writes in one launch (ClusTR has two).
MAX_SCALES = 2
# Columns per tile of pass 2 (its running minimum is (BLOCK,
# DENSER_BLOCK_N) in registers); warps of the assignment (the other layouts:
# kernel_config).
DENSER_BLOCK_N, ASSIGN_WARPS = 32, 8
# Positions per step of the pruning's one program per window; the most
# channels kernel_config prunes pass 2 for.
PENDING_BLOCK, PRUNE_MAX_CHANNELS = 1024, 128


if triton is not None:

    @triton.jit
    def _prep_kernel(x_ptr, pad_ptr, hi_ptr, lo_ptr, sq_ptr, tie_ptr, total,
                     TIE: tl.constexpr, C: tl.constexpr,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                     HAS_PAD: tl.constexpr, SPLIT: tl.constexpr):
        """Per token: |x|^2 (+inf where padded), tie threshold TIE |x|^2
        and, with SPLIT, the tf32 halves hi = tf32(x), lo = tf32(x - hi)
        (round to nearest, ties away from zero, as ``cvt.rna.tf32.f32`` and
        :func:`~.reference.tf32_split`). Grid: token blocks."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0,
                                                                   BLOCK_R)
        rmask = rows < total
        sq = tl.zeros((BLOCK_R, ), tl.float32)
        for c0 in range(0, C, BLOCK_C):
            ch = c0 + tl.arange(0, BLOCK_C)
            at = rows[:, None] * C + ch[None, :]
            m = rmask[:, None] & (ch[None, :] < C)
            v = tl.load(x_ptr + at, mask=m, other=0.0)
            sq += tl.sum(v * v, 1)
            if SPLIT:
                hi = ((v.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(
                    tl.float32, bitcast=True)
                r = v - hi
                lo = ((r.to(tl.int32, bitcast=True) + 0x1000) & -8192).to(
                    tl.float32, bitcast=True)
                tl.store(hi_ptr + at, hi, mask=m)
                tl.store(lo_ptr + at, lo, mask=m)
        tl.store(tie_ptr + rows, sq * TIE, mask=rmask)
        if HAS_PAD:
            pad = tl.load(pad_ptr + rows, mask=rmask, other=0) != 0
            sq = tl.where(pad, float('inf'), sq)
        tl.store(sq_ptr + rows, sq, mask=rmask)

    @triton.jit
    def _products(a_ptr, alo_ptr, rtok, rmask, ctok, cmask,
                  C: tl.constexpr, BLOCK_C: tl.constexpr,
                  PRECISION: tl.constexpr, MASKED: tl.constexpr):
        """(BM, BN) dot products of tokens ``rtok`` and ``ctok`` (flat token
        indices; masked loads only where MASKED): one fp32 FMA chain per
        entry over the channels in order ('ieee'), or the 3xTF32 sum of the
        pre-split halves ``a_ptr`` (hi) and ``alo_ptr`` (lo) on tensor
        cores ('tf32x3')."""
        acc = tl.zeros((rtok.shape[0], ctok.shape[0]), tl.float32)
        for c0 in range(0, C, BLOCK_C):
            ch = c0 + tl.arange(0, BLOCK_C)
            ra = rtok[:, None] * C + ch[None, :]
            cb = ctok[None, :] * C + ch[:, None]
            if MASKED:
                ma = rmask[:, None] & (ch[None, :] < C)
                mb = cmask[None, :] & (ch[:, None] < C)
                a = tl.load(a_ptr + ra, mask=ma, other=0.0)
                b = tl.load(a_ptr + cb, mask=mb, other=0.0)
            else:
                a = tl.load(a_ptr + ra)
                b = tl.load(a_ptr + cb)
            if PRECISION == 'tf32x3':
                if MASKED:
                    al = tl.load(alo_ptr + ra, mask=ma, other=0.0)
                    bl = tl.load(alo_ptr + cb, mask=mb, other=0.0)
                else:
                    al = tl.load(alo_ptr + ra)
                    bl = tl.load(alo_ptr + cb)
                acc = tl.dot(al, b, acc, input_precision='tf32')
                acc = tl.dot(a, bl, acc, input_precision='tf32')
                acc = tl.dot(a, b, acc, input_precision='tf32')
            else:
                acc = tl.dot(a, b, acc, input_precision='ieee')
        return acc

    @triton.jit
    def _dot(a, al, b, bl, PRECISION: tl.constexpr):
        """a @ b in PRECISION; ``al``/``bl``: the lo halves ('tf32x3')."""
        if PRECISION == 'tf32x3':
            acc = tl.dot(al, b, input_precision='tf32')
            acc = tl.dot(a, bl, acc, input_precision='tf32')
            return tl.dot(a, b, acc, input_precision='tf32')
        return tl.dot(a, b, input_precision='ieee')

    @triton.jit
    def _tokens(ptr, lo_ptr, tok, mask, C: tl.constexpr,
                PRECISION: tl.constexpr, MASKED: tl.constexpr,
                COLUMNS: tl.constexpr):
        """All C channels of tokens ``tok``, (T, C), or (C, T) as COLUMNS,
        and their lo halves ('tf32x3'; else the same tensor)."""
        ch = tl.arange(0, C)
        if COLUMNS:
            at = tok[None, :] * C + ch[:, None]
            m = mask[None, :]
        else:
            at = tok[:, None] * C + ch[None, :]
            m = mask[:, None]
        if MASKED:
            v = tl.load(ptr + at, mask=m, other=0.0)
        else:
            v = tl.load(ptr + at)
        lo = v
        if PRECISION == 'tf32x3':
            if MASKED:
                lo = tl.load(lo_ptr + at, mask=m, other=0.0)
            else:
                lo = tl.load(lo_ptr + at)
        return v, lo

    @triton.jit
    def _distances(sq_r, sq_c, acc):
        """Squared distances |a|^2 + |b|^2 - 2 a.b of a tile from its
        products (+inf where either token is padding: |x|^2 = +inf)."""
        return sq_r[:, None] + sq_c[None, :] - 2.0 * acc

    @triton.jit
    def _row_block(x_ptr, lo_ptr, rtok, rmask, C: tl.constexpr,
                   PRECISION: tl.constexpr, MASKED: tl.constexpr,
                   ROWS_ONCE: tl.constexpr):
        """The row block's channels and lo halves, loaded once for every
        tile (ROWS_ONCE); without it the tiles load them per channel step
        and the row indices stand in (unused)."""
        if ROWS_ONCE:
            a, al = _tokens(x_ptr, lo_ptr, rtok, rmask, C, PRECISION, MASKED,
                            False)
        else:
            a, al = rtok, rtok
        return a, al

    @triton.jit
    def _tile_distances(x_ptr, lo_ptr, sq_ptr, a, al, sq_r, rtok, rmask,
                        ctok, cmask, C: tl.constexpr, BLOCK_C: tl.constexpr,
                        PRECISION: tl.constexpr, MASKED: tl.constexpr,
                        ROWS_ONCE: tl.constexpr):
        """Squared distances of the row block (``a``/``al`` from
        :func:`_row_block`, norms ``sq_r``) to tokens ``ctok``."""
        if ROWS_ONCE:
            b, bl = _tokens(x_ptr, lo_ptr, ctok, cmask, C, PRECISION, MASKED,
                            True)
            acc = _dot(a, al, b, bl, PRECISION)
        else:
            acc = _products(x_ptr, lo_ptr, rtok, rmask, ctok, cmask, C,
                            BLOCK_C, PRECISION, MASKED)
        sq_c = tl.load(sq_ptr + ctok, mask=cmask, other=float('inf'))
        return _distances(sq_r, sq_c, acc)

    @triton.jit
    def _order(low, d):
        """(min, max) of two tensors, elementwise: one step of an insertion
        network."""
        return tl.minimum(low, d), tl.maximum(low, d)

    @triton.jit
    def _insert(L0, L1, L2, L3, L4, L5, L6, L7, d, K: tl.constexpr):
        """Insert ``d`` elementwise into the ascending lists L0..L{K-1}
        (the largest falls off: the last step's maximum is never used)."""
        L0, d = _order(L0, d)
        if K > 1:
            L1, d = _order(L1, d)
        if K > 2:
            L2, d = _order(L2, d)
        if K > 3:
            L3, d = _order(L3, d)
        if K > 4:
            L4, d = _order(L4, d)
        if K > 5:
            L5, d = _order(L5, d)
        if K > 6:
            L6, d = _order(L6, d)
        if K > 7:
            L7, d = _order(L7, d)
        return L0, L1, L2, L3, L4, L5, L6, L7

    @triton.jit
    def _pop(L0, L1, L2, L3, L4, L5, L6, L7, hit, K: tl.constexpr):
        """Drop the head of the lists where ``hit`` (shift up, +inf in)."""
        L0 = tl.where(hit, L1, L0)
        if K > 2:
            L1 = tl.where(hit, L2, L1)
        if K > 3:
            L2 = tl.where(hit, L3, L2)
        if K > 4:
            L3 = tl.where(hit, L4, L3)
        if K > 5:
            L4 = tl.where(hit, L5, L4)
        if K > 6:
            L5 = tl.where(hit, L6, L5)
        if K > 7:
            L6 = tl.where(hit, L7, L6)
        return L0, L1, L2, L3, L4, L5, L6, L7

    @triton.jit
    def _knn_kernel(x_ptr, lo_ptr, sq_ptr, tie_ptr, scale_ptr, knn_ptr,
                    rho_ptr, rowmax_ptr, first_ptr, near_ptr, near_d_ptr, n,
                    C: tl.constexpr, K: tl.constexpr, BLOCK: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                    PRECISION: tl.constexpr, MASKED: tl.constexpr,
                    HAS_SCALE: tl.constexpr, LIBDEVICE: tl.constexpr,
                    ROWS_ONCE: tl.constexpr, NEAREST: tl.constexpr):
        """Pass 1 (module docstring): the BLOCK rows of row block I fold
        every tile of BLOCK_N columns, theirs first; writes each row's K
        smallest squared distances (ascending, +inf past a window's
        tokens), largest distance to a real token (0 at least), first
        column within the tie threshold and raw density. With NEAREST also
        each row's nearest other token and its distance, where its lane
        knows it (-1 where not: see :func:`_nearest_other`). Grid:
        (windows, row blocks)."""
        g = tl.program_id(0).to(tl.int64)
        blk = tl.program_id(1)
        rows = blk * BLOCK + tl.arange(0, BLOCK)
        lane = tl.arange(0, BLOCK_N)
        rmask = rows < n
        base = g * n
        tie = tl.load(tie_ptr + base + rows, mask=rmask, other=0.0)
        sq_r = tl.load(sq_ptr + base + rows, mask=rmask, other=float('inf'))
        inf = tl.full((BLOCK, BLOCK_N), float('inf'), tl.float32)
        L0, L1, L2, L3, L4, L5, L6, L7 = inf, inf, inf, inf, inf, inf, inf, inf
        far = tl.zeros((BLOCK, BLOCK_N), tl.float32)
        # NEAREST: the column of the key in each lane's L0 (-1: none)
        I0 = tl.full((BLOCK, BLOCK_N), -1, tl.int32)
        a, al = _row_block(x_ptr, lo_ptr, base + rows, rmask, C, PRECISION,
                           MASKED, ROWS_ONCE)
        tiles = tl.cdiv(n, BLOCK_N)
        own = blk * (BLOCK // BLOCK_N)  # the first tile of the rows' own
        for j in range(0, tiles):
            cols = ((own + j) % tiles) * BLOCK_N + lane
            cmask = cols < n
            d = _tile_distances(x_ptr, lo_ptr, sq_ptr, a, al, sq_r,
                                base + rows, rmask, base + cols, cmask, C,
                                BLOCK_C, PRECISION, MASKED, ROWS_ONCE)
            if j < BLOCK // BLOCK_N:  # the own tiles: 0 on the diagonal
                d = tl.where(rows[:, None] == cols[None, :], 0.0, d)
            far = tl.maximum(far, tl.where(d < float('inf'), d, 0.0))
            # a distance within the tie threshold is a duplicate: key
            # col - n < 0, so duplicates come first, the lowest column
            # first, and count as distance 0
            key = tl.where(d <= tie[:, None],
                           (cols - n).to(tl.float32)[None, :], d)
            if NEAREST:
                I0 = tl.where(key < L0, cols[None, :], I0)
            L0, L1, L2, L3, L4, L5, L6, L7 = _insert(
                L0, L1, L2, L3, L4, L5, L6, L7, key, K)
        # once per row block: the rows' K smallest keys of their lanes'
        # lists; the first is a duplicate (the diagonal at the latest)
        first = tl.where(rmask, tl.min(L0, 1) + n, 0.0)
        total = tl.zeros((BLOCK, ), tl.float32)
        near = tl.full((BLOCK, ), -1, tl.int32)
        near_d = tl.full((BLOCK, ), float('inf'), tl.float32)
        for j in tl.static_range(K):
            v, at = tl.min(L0, axis=1, return_indices=True)
            v = tl.maximum(v, 0.0)
            tl.store(knn_ptr + (base + rows) * K + j, v, mask=rmask)
            hit = lane[None, :] == at[:, None]
            if NEAREST:
                if j < 2:
                    near, near_d = _nearest_other(near, near_d, I0, hit,
                                                  v, rows, j)
                if j == 0:  # the lane's next key's column is not kept
                    I0 = tl.where(hit, -1, I0)
            if HAS_SCALE:  # short windows: +inf neighbours leave the mean
                v = tl.where(v < float('inf'), v, 0.0)
            total += v
            L0, L1, L2, L3, L4, L5, L6, L7 = _pop(
                L0, L1, L2, L3, L4, L5, L6, L7, hit, K)
        mean = total / K
        if HAS_SCALE:
            mean = mean * tl.load(scale_ptr + g)
        if LIBDEVICE:  # compiled: libdevice's exp, as torch's (1 ulp)
            rho = libdevice.exp(mean / -C)
        else:  # Triton's interpreter: numpy's
            rho = tl.exp(mean / -C)
        rho = tl.where(sq_r < float('inf'), rho, -1.0)
        tl.store(rho_ptr + base + rows, rho, mask=rmask)
        tl.store(rowmax_ptr + base + rows, tl.max(far, 1), mask=rmask)
        tl.store(first_ptr + base + rows, first.to(tl.int64), mask=rmask)
        if NEAREST:  # K = 1: the row itself only, the other unknown
            tl.store(near_ptr + base + rows, tl.maximum(near, -1),
                     mask=rmask)
            tl.store(near_d_ptr + base + rows, near_d, mask=rmask)

    @triton.jit
    def _nearest_other(near, near_d, I0, hit, v, rows, j: tl.constexpr):
        """Pass 1's nearest other token of each row from its first two
        keys (popped ``j`` = 0, 1; ``hit``: the popped lane, ``v`` the
        distance): the first that is not the row itself (itself, or a
        duplicate of lower column, comes first). A lane keeps the column
        of its smallest key only, so where both came from one lane the
        second is unknown (-1)."""
        col = tl.max(tl.where(hit, I0, -1), 1)
        if j == 0:
            near = tl.where(col == rows, -2, col)  # -2: the row itself
            near_d = v
        else:
            itself = near == -2
            near = tl.where(itself, col, near)
            near_d = tl.where(itself, v, near_d)
        return near, near_d

    @triton.jit
    def _window_max(rowmax_ptr, base, n, BLOCK: tl.constexpr):
        """The window's largest distance (from pass 1's row maxima)."""
        lane = tl.arange(0, BLOCK)
        top = tl.zeros((BLOCK, ), tl.float32)
        for c0 in range(0, n, BLOCK):
            top = tl.maximum(top, tl.load(rowmax_ptr + base + c0 + lane,
                                          mask=c0 + lane < n, other=0.0))
        return tl.max(top, 0)

    @triton.jit
    def _score(delta2, dmax2, tie, rho, sq_r, C: tl.constexpr):
        """The center score ``rho * sqrt(delta2 / C)`` (delta2 capped by
        the window's largest distance, ties snapped to 0; -inf at
        padding)."""
        dl = tl.minimum(delta2, dmax2)
        dl = tl.where(dl <= tie, 0.0, dl)
        score = rho * tl.sqrt_rn(dl / C)
        return tl.where(sq_r < float('inf'), score, float('-inf'))

    @triton.jit
    def _pending_kernel(sq_ptr, tie_ptr, order_ptr, rho_ptr, rowmax_ptr,
                        near_ptr, near_d_ptr, delta2_ptr, score_ptr,
                        dmax2_ptr, pending_ptr, count_ptr, n,
                        C: tl.constexpr, BLOCK: tl.constexpr):
        """Pass 2's pruning (module docstring): a token whose nearest
        other token (pass 1) is denser has it as its nearest denser token;
        its delta2 and score are written here. The density-order positions
        of the others go, ascending, to ``pending`` and their number to
        ``count``; the window's largest distance to ``dmax2``. Grid:
        windows."""
        g = tl.program_id(0).to(tl.int64)
        base = g * n
        dmax2 = _window_max(rowmax_ptr, base, n, BLOCK)
        tl.store(dmax2_ptr + g, dmax2)
        lane = tl.arange(0, BLOCK)
        done = tl.sum(tl.zeros((BLOCK, ), tl.int32), 0)
        for p0 in range(0, n, BLOCK):
            pos = p0 + lane
            pmask = pos < n
            rows = tl.load(order_ptr + base + pos, mask=pmask, other=0)
            near = tl.load(near_ptr + base + rows, mask=pmask, other=-1)
            known = pmask & (near >= 0)
            rho = tl.load(rho_ptr + base + rows, mask=pmask, other=-1.0)
            rho_n = tl.load(rho_ptr + base + near, mask=known, other=-1.0)
            # earlier in the order: denser, or as dense and a lower index
            # (the order is a stable descending sort)
            solved = known & ((rho_n > rho) | ((rho_n == rho) & (near < rows)))
            d2 = tl.load(near_d_ptr + base + rows, mask=solved, other=0.0)
            tie = tl.load(tie_ptr + base + rows, mask=solved, other=0.0)
            sq_r = tl.load(sq_ptr + base + rows, mask=solved, other=0.0)
            tl.store(delta2_ptr + base + rows, d2, mask=solved)
            tl.store(score_ptr + base + rows,
                     _score(d2, dmax2, tie, rho, sq_r, C), mask=solved)
            wait = (pmask & ~solved).to(tl.int32)
            tl.store(pending_ptr + base + done + tl.cumsum(wait, 0) - 1, pos,
                     mask=wait != 0)
            done += tl.sum(wait, 0)
        tl.store(count_ptr + g, done)

    @triton.jit
    def _denser_kernel(x_ptr, lo_ptr, sq_ptr, tie_ptr, order_ptr, rho_ptr,
                       rowmax_ptr, dmax2_ptr, pending_ptr, count_ptr,
                       delta2_ptr, score_ptr, n,
                       C: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr,
                       PRECISION: tl.constexpr, MASKED: tl.constexpr,
                       ROWS_ONCE: tl.constexpr, PENDING: tl.constexpr):
        """Pass 2 (module docstring): for the tokens at positions
        [start, start + BLOCK) of the density order, the smallest squared
        distance to a token earlier in the order (+inf for the first), and
        the center score; columns in tiles of BLOCK_N. With PENDING the
        rows are the block's positions of ``pending`` instead (the first
        ``count`` of the window, ascending; :func:`_pending_kernel`), the
        columns those before the block's last. Grid: (windows, row
        blocks)."""
        g = tl.program_id(0).to(tl.int64)
        lane = tl.arange(0, BLOCK)
        base = g * n
        if PENDING:
            at = tl.program_id(1) * BLOCK + lane
            pmask = at < tl.load(count_ptr + g)
            pos = tl.load(pending_ptr + base + at, mask=pmask, other=0)
            start = 0  # every tile: the rows lie anywhere in the order
            end = tl.max(tl.where(pmask, pos, -1), 0) + 1
            dmax2 = tl.load(dmax2_ptr + g)
        else:
            start = tl.program_id(1) * BLOCK
            pos = start + lane
            pmask = pos < n
            end = start + BLOCK
            dmax2 = _window_max(rowmax_ptr, base, n, BLOCK)
        rows = tl.load(order_ptr + base + pos, mask=pmask, other=0)
        sq_r = tl.load(sq_ptr + base + rows, mask=pmask, other=float('inf'))
        a, al = _row_block(x_ptr, lo_ptr, base + rows, pmask, C, PRECISION,
                           MASKED, ROWS_ONCE)
        near = tl.full((BLOCK, BLOCK_N), float('inf'), tl.float32)
        for c0 in range(0, end, BLOCK_N):
            cpos = c0 + tl.arange(0, BLOCK_N)
            cmask = cpos < n
            cols = tl.load(order_ptr + base + cpos, mask=cmask, other=0)
            d = _tile_distances(x_ptr, lo_ptr, sq_ptr, a, al, sq_r,
                                base + rows, pmask, base + cols, cmask, C,
                                BLOCK_C, PRECISION, MASKED, ROWS_ONCE)
            if c0 >= start:  # the own tiles: the columns before each row
                d = tl.where(cpos[None, :] < pos[:, None], d, float('inf'))
            near = tl.minimum(near, d)
        delta2 = tl.min(near, 1)
        tie = tl.load(tie_ptr + base + rows, mask=pmask, other=0.0)
        rho = tl.load(rho_ptr + base + rows, mask=pmask, other=-1.0)
        tl.store(delta2_ptr + base + rows, delta2, mask=pmask)
        tl.store(score_ptr + base + rows,
                 _score(delta2, dmax2, tie, rho, sq_r, C), mask=pmask)

    @triton.jit
    def _nearest(best, idx, d, valid, k0):
        """Running first minimum over center tiles (argmin's tie rule)."""
        v, at = tl.min(tl.where(valid[None, :], d, float('inf')), axis=1,
                       return_indices=True)
        better = v < best
        return tl.where(better, v, best), tl.where(better, k0 + at, idx)

    @triton.jit
    def _assign_kernel(x_ptr, lo_ptr, sq_ptr, tie_ptr, centers_ptr,
                       slots_ptr, out_ptr, n, G, num, count0, center_stride,
                       C: tl.constexpr, S: tl.constexpr,
                       HAS_SLOTS: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
                       PRECISION: tl.constexpr, ROWS_ONCE: tl.constexpr):
        """Step 5 for S <= 2 scales: the id of each token's nearest center
        per scale, (S, G, n) int64, products in PRECISION as passes 1 and
        2. Ties snapped to 0, a center joins itself, the better-scored
        center wins ties; slot k is a center of scale s where ``slots[s, g,
        k]`` (HAS_SLOTS) or, with one scale, k < count0. Grid: (windows,
        row blocks)."""
        g = tl.program_id(0).to(tl.int64)
        lane = tl.arange(0, BLOCK)
        rows = tl.program_id(1) * BLOCK + lane
        rmask = rows < n
        base = g * n
        sq_r = tl.load(sq_ptr + base + rows, mask=rmask, other=float('inf'))
        tie = tl.load(tie_ptr + base + rows, mask=rmask, other=0.0)
        a, al = _row_block(x_ptr, lo_ptr, base + rows, rmask, C, PRECISION,
                           True, ROWS_ONCE)
        best0 = tl.full((BLOCK, ), float('inf'), tl.float32)
        best1 = best0
        idx0 = tl.zeros((BLOCK, ), tl.int32)
        idx1 = idx0
        for k0 in range(0, num, BLOCK_K):
            slot = k0 + tl.arange(0, BLOCK_K)
            kmask = slot < num
            cid = tl.load(centers_ptr + g * center_stride + slot, mask=kmask,
                          other=0)
            d = _tile_distances(x_ptr, lo_ptr, sq_ptr, a, al, sq_r,
                                base + rows, rmask, base + cid, kmask, C,
                                BLOCK_C, PRECISION, True, ROWS_ONCE)
            d = tl.where(d <= tie[:, None], 0.0, d)
            d = tl.where(cid[None, :] == rows[:, None], float('-inf'), d)
            if HAS_SLOTS:
                v0 = tl.load(slots_ptr + g * num + slot, mask=kmask,
                             other=0) != 0
            else:
                v0 = slot < count0
            best0, idx0 = _nearest(best0, idx0, d, v0, k0)
            if S > 1:
                v1 = tl.load(slots_ptr + (G + g) * num + slot, mask=kmask,
                             other=0) != 0
                best1, idx1 = _nearest(best1, idx1, d, v1, k0)
        tl.store(out_ptr + base + rows, idx0.to(tl.int64), mask=rmask)
        if S > 1:
            tl.store(out_ptr + (G + g) * n + rows, idx1.to(tl.int64),
                     mask=rmask)


def _masked(n: int, c: int) -> bool:
    """Whether the tiles need masked loads (a partial token block or
    channel step)."""
    return n % BLOCK != 0 or c % BLOCK_C != 0


def _whole_rows(c: int) -> bool:
    """Whether a row block's C channels fit in one product (a power of 2,
    16 to 64)."""
    return c in (16, 32, 64)


class KernelConfig(NamedTuple):
    """How the kernels are laid out (speed only: every layout gives the same
    ids). ``warps`` of pass 1; ``rows_once``: passes 1 and 2 and the
    assignment load a row block's channels once per program instead of per
    tile (fewer instructions per distance, more registers); ``stages``:
    Triton's software pipelining (more registers);
    ``denser_warps`` of pass 2; ``assign_block``: centers per step of the
    assignment; ``prune_denser``: pass 1 also keeps each token's nearest
    other token, and pass 2 scans only the tokens for which it is not
    denser (module docstring; on where a GPU measured it faster with the
    same ids: :data:`MEASURED`)."""
    warps: int
    rows_once: bool
    stages: int = 1
    denser_warps: int = 4
    assign_block: int = 64
    prune_denser: bool = False


class Pass1(NamedTuple):
    """Pass 1's outputs, (G, n, k) or (G, n): the k smallest squared
    distances ascending (duplicates as 0), raw density, largest distance to
    a real token, first column within the tie threshold (int64); with
    ``prune_denser`` the nearest other token (int32, -1 where pass 1 does
    not know it) and its squared distance, else None."""
    knn: torch.Tensor
    rho: torch.Tensor
    rowmax: torch.Tensor
    first: torch.Tensor
    nearest: Optional[torch.Tensor] = None
    nearest_d2: Optional[torch.Tensor] = None


@functools.lru_cache(maxsize=None)
def _arch(device: torch.device) -> int:
    """Compute capability major of ``device`` (9 under the interpreter)."""
    if device.type != 'cuda':
        return 9
    return torch.cuda.get_device_capability(device)[0]


# Layouts measured fastest on a GPU, by (compute capability major,
# channels, precision) (``clustering_speed.py --sweep``): ClusTR-S's three
# clustered stages on an H200 (2026-11-27, Triton 3.6, batch 128 at 224):
# passes 1 + 2 in 4.98 / 1.49 / 0.39 ms, against 5.67 / 2.72 / 0.48 with
# kernel_config's rules (docs/benchmarks.md). Pass 2 pruned where that was
# faster with the same ids (``clustering_speed.py``'s pruned rows, H200,
# 2026-11-28, passes 1 + 2 per call at 64 / 128 channels: tf32x3 5.78 /
# 1.61 ms against 6.02 / 1.88 in full, ieee 28.47 / 6.71 against 37.18 /
# 7.99; the ieee layouts are the rules').
MEASURED: Dict[Tuple[int, int, str], KernelConfig] = {
    (9, 64, 'tf32x3'): KernelConfig(4, True, 2, prune_denser=True),
    (9, 128, 'tf32x3'): KernelConfig(8, True, 3, prune_denser=True),
    (9, 256, 'tf32x3'): KernelConfig(4, False, 2),
    (9, 64, 'ieee'): KernelConfig(4, True, prune_denser=True),
    (9, 128, 'ieee'): KernelConfig(8, False, prune_denser=True),
}


def kernel_config(device: torch.device, channels: int, precision: str,
                  prune: Optional[bool] = None) -> KernelConfig:
    """The kernels' layout on ``device`` for tokens of ``channels``:
    :data:`MEASURED`'s, else by rule, each free of spills in ptxas
    (``tests/test_dpc_knn_fused.py::test_kernels_compile_for_gpus``, Triton
    3.6 and 3.8). sm_90 and newer: rows loaded once for 16, 32 or 64
    channels, 4 warps with 'tf32x3' or rows loaded once, else 8. Older
    (sm_80's smaller register budget for the same tiles with mma.sync):
    rows loaded per tile, 8 warps for passes 2 and IEEE 1, 32 centers per
    step.

    ``prune``: None, pass 2 pruned as the layout says (on where measured
    faster); False, never; True, the same layout with ``prune_denser``
    where it lowers the tile loops' instructions (PTX, per window, passes
    1 and 2; on ClusTR-S's stage tokens at 224, docs/backbones.md): up to
    128 channels, but not on sm_80 with 'tf32x3', where pass 1 has no room
    for the nearest columns at 4 warps and at 8 costs more than pass 2
    saves (over 128 channels likewise: 8 warps, and windows too small for
    pass 2 to matter)."""
    arch = _arch(device)
    config = MEASURED.get((arch, channels, precision))
    if config is None and arch < 9:
        config = KernelConfig(4 if precision == 'tf32x3' else 8, False,
                              denser_warps=8, assign_block=32)
    elif config is None:
        rows_once = _whole_rows(channels)
        config = KernelConfig(4 if precision == 'tf32x3' or rows_once else 8,
                              rows_once)
    if prune is None:
        return config
    if not prune or channels > PRUNE_MAX_CHANNELS or (
            arch < 9 and precision == 'tf32x3'):
        return config._replace(prune_denser=False)
    return config._replace(prune_denser=True)


def _prep(x: torch.Tensor, invalid: Optional[torch.Tensor], precision: str):
    """:func:`_prep_kernel` on (G, n, C) tokens: (hi, lo, sq, tie); hi is
    ``x`` and lo None unless 'tf32x3'."""
    g, n, c = x.shape
    split = precision == 'tf32x3'
    hi = torch.empty_like(x) if split else x
    lo = torch.empty_like(x) if split else x
    sq, tie = x.new_empty(g, n), x.new_empty(g, n)
    pad = sq if invalid is None else invalid.view(torch.uint8)
    total = g * n
    _prep_kernel[(triton.cdiv(total, 32), )](
        x, pad, hi, lo, sq, tie, total, TIE=tie_tolerance(c, precision),
        C=c, BLOCK_R=32, BLOCK_C=min(64, triton.next_power_of_2(c)),
        HAS_PAD=invalid is not None, SPLIT=split)
    return hi, (lo if split else None), sq, tie


def _knn_pass(hi, lo, sq, tie, knn_scale, k: int, precision: str,
              config: Optional[KernelConfig] = None) -> Pass1:
    """Pass 1 on (G, n, C) tokens (``hi``/``lo``/``sq``/``tie``:
    :func:`_prep`). ``config``: :func:`kernel_config`'s unless given."""
    g, n, c = hi.shape
    if not 1 <= k <= MAX_K:
        raise ValueError(f'the fused DPC-kNN takes k in [1, {MAX_K}] '
                         f'neighbours, got {k}')
    config = config or kernel_config(hi.device, c, precision)
    knn_d = hi.new_empty(g, n, k)
    rho, rowmax = hi.new_empty(g, n), hi.new_empty(g, n)
    first = torch.empty(g, n, dtype=torch.long, device=hi.device)
    nearest = nearest_d2 = None
    if config.prune_denser:
        nearest = torch.empty(g, n, dtype=torch.int32, device=hi.device)
        nearest_d2 = hi.new_empty(g, n)
    _knn_kernel[(g, triton.cdiv(n, BLOCK))](
        hi, hi if lo is None else lo, sq, tie,
        sq if knn_scale is None else knn_scale, knn_d, rho, rowmax, first,
        first if nearest is None else nearest,
        sq if nearest_d2 is None else nearest_d2,
        n, C=c, K=k, BLOCK=BLOCK, BLOCK_N=KNN_BLOCK_N, BLOCK_C=BLOCK_C,
        PRECISION=precision, MASKED=_masked(n, c),
        HAS_SCALE=knn_scale is not None,
        LIBDEVICE=hi.is_cuda and libdevice is not None,
        ROWS_ONCE=config.rows_once, NEAREST=config.prune_denser,
        num_warps=config.warps, num_stages=config.stages)
    return Pass1(knn_d, rho, rowmax, first, nearest, nearest_d2)


def _denser_pass(hi, lo, sq, tie, order, rho, rowmax, precision: str,
                 config: Optional[KernelConfig] = None,
                 pass1: Optional[Pass1] = None):
    """Pass 2: (G, n) squared distance to the nearest denser token and
    center score, by token (``config``: as :func:`_knn_pass`'s). Given a
    ``pass1`` that kept the nearest other tokens, the tokens for which that
    one is denser are settled by :func:`_pending_kernel` and the kernel
    scans for the others only."""
    g, n, c = hi.shape
    delta2, score = hi.new_empty(g, n), hi.new_empty(g, n)
    config = config or kernel_config(hi.device, c, precision)
    prune = pass1 is not None and pass1.nearest is not None
    dmax2 = pending = count = sq  # read only when pruning
    if prune:
        dmax2 = hi.new_empty(g)
        pending = torch.empty(g, n, dtype=torch.int32, device=hi.device)
        count = torch.empty(g, dtype=torch.int32, device=hi.device)
        _pending_kernel[(g, )](
            sq, tie, order, rho, rowmax, pass1.nearest, pass1.nearest_d2,
            delta2, score, dmax2, pending, count, n, C=c,
            BLOCK=PENDING_BLOCK)
    _denser_kernel[(g, triton.cdiv(n, BLOCK))](
        hi, hi if lo is None else lo, sq, tie, order, rho, rowmax, dmax2,
        pending, count, delta2, score, n, C=c, BLOCK=BLOCK,
        BLOCK_N=DENSER_BLOCK_N, BLOCK_C=BLOCK_C, PRECISION=precision,
        MASKED=_masked(n, c), ROWS_ONCE=config.rows_once, PENDING=prune,
        num_warps=config.denser_warps, num_stages=config.stages)
    return delta2, score


def settled_by_nearest(pass1: Pass1, rho: torch.Tensor) -> torch.Tensor:
    """(G, n) bool: the tokens whose nearest other token (``pass1`` with
    ``prune_denser``) is denser under ``rho`` (after the duplicates'
    gather), i.e. those :func:`_pending_kernel` settles and pass 2 does not
    scan; in torch, for tools and tests."""
    near = pass1.nearest.long()
    index = torch.arange(near.shape[1], device=near.device)
    rho_near = rho.gather(1, near.clamp(min=0))
    return (near >= 0) & ((rho_near > rho) |
                          ((rho_near == rho) & (near < index)))


def _assign(hi, lo, sq, tie, centers, counts: Sequence[int],
            slots: Optional[torch.Tensor], precision: str,
            config: Optional[KernelConfig] = None) -> torch.Tensor:
    """Step 5: (S, G, n) nearest center ids of every scale (``config``:
    as :func:`_knn_pass`'s)."""
    g, n, c = hi.shape
    if len(counts) > MAX_SCALES:
        raise ValueError(f'the fused DPC-kNN assigns at most {MAX_SCALES} '
                         f'scales, got {len(counts)}')
    num = centers.shape[1]
    ids = torch.empty(len(counts), g, n, dtype=torch.long, device=hi.device)
    config = config or kernel_config(hi.device, c, precision)
    _assign_kernel[(g, triton.cdiv(n, BLOCK))](
        hi, hi if lo is None else lo, sq, tie, centers,
        sq if slots is None else slots.contiguous().view(torch.uint8), ids,
        n, g, num, counts[0], centers.stride(0), C=c, S=len(counts),
        HAS_SLOTS=slots is not None, BLOCK=BLOCK,
        BLOCK_K=config.assign_block, BLOCK_C=BLOCK_C, PRECISION=precision,
        ROWS_ONCE=config.rows_once, num_warps=ASSIGN_WARPS,
        num_stages=config.stages)
    return ids


def _triton_passes(x: torch.Tensor, counts: Sequence[int], k: int,
                   windows: Windows, precision: str,
                   probe: Optional[dict] = None,
                   config: Optional[KernelConfig] = None) -> torch.Tensor:
    """The fused implementation (module docstring; ``probe``: as
    :func:`~.reference.dpc_knn_reference`'s; ``config``: all kernels'
    layout, :func:`kernel_config`'s unless given)."""
    x = x.contiguous()
    config = config or kernel_config(x.device, x.shape[2], precision)
    hi, lo, sq, tie = _prep(x, windows.invalid, precision)
    pass1 = _knn_pass(hi, lo, sq, tie, windows.knn_scale,
                      min(k, x.shape[1]), precision, config)
    # identical tokens: the first's density
    rho = pass1.rho.gather(1, pass1.first)
    order = torch.sort(rho, dim=1, descending=True, stable=True).indices
    delta2, score = _denser_pass(hi, lo, sq, tie, order, rho, pass1.rowmax,
                                 precision, config, pass1)
    centers = torch.sort(score, dim=1, descending=True,
                         stable=True).indices[:, :max(counts)]  # a view
    if probe is not None:
        record(probe, knn=pass1.knn, first=pass1.first, rho=rho,
               delta2=delta2, dmax2=pass1.rowmax.amax(-1), centers=centers)
    return _assign(hi, lo, sq, tie, centers, counts, windows.center_slots,
                   precision, config)


def probed(x: torch.Tensor, counts: Sequence[int], k: int,
           windows: Windows, plan: ClusteringPlan,
           config: Optional[KernelConfig] = None):
    """The kernels' ids and their intermediate values (``probe``: as
    :func:`~.reference.dpc_knn_reference`'s) in the plan's precision,
    outside the op: for comparing them with another backend
    (:mod:`.first_use`, tests; ``config``: as :func:`_triton_passes`')."""
    probe = {}
    ids = _triton_passes(x, counts, k, windows, plan.precision, probe,
                         config)
    return ids, probe


def gpu_launches(x: torch.Tensor, invalid: Optional[torch.Tensor],
                 knn_scale: Optional[torch.Tensor],
                 center_valid: Optional[torch.Tensor], counts: List[int],
                 k: int, precision: str) -> List[str]:
    """The kernels and torch ops one call of the op launches where the
    kernels run (:func:`_triton_passes`), in order, given the op's
    arguments: for the op census, which counts the CUDA path on devices
    where it cannot run (the layout :func:`kernel_config` gives on the
    tensors' device; a CPU stands for sm_90). A run under Triton's
    interpreter counts the same (``tests/test_dpc_knn_fused.py``)."""
    config = kernel_config(x.device, x.shape[2], precision)
    pending = ['_pending_kernel'] if config.prune_denser else []
    return (['_prep_kernel', '_knn_kernel', 'gather', 'sort'] + pending +
            ['_denser_kernel', 'sort', '_assign_kernel'])


def runs_kernels(x: torch.Tensor) -> bool:
    """Whether the op runs the kernels on ``x`` (a CUDA tensor, or Triton's
    interpreter on); otherwise it runs the blocked backend."""
    return triton is not None and (x.is_cuda or INTERPRET)


def _dpc_knn(x: torch.Tensor, invalid: Optional[torch.Tensor],
             knn_scale: Optional[torch.Tensor],
             center_valid: Optional[torch.Tensor], counts: List[int],
             k: int, precision: str) -> torch.Tensor:
    padding = None if invalid is None else Padding(invalid, knn_scale)
    if runs_kernels(x):
        # the kernels read only the padding and the center slots: no
        # constants to make (x.new_tensor(inf) is a host-to-device copy that
        # waits for the stream, once per call)
        return _triton_passes(x, counts, k, Windows(None, None, None, padding,
                                                    center_valid), precision)
    # where the kernels cannot run: the blocked backend (IEEE fp32 whatever
    # the precision asked for) under the fused plan's budget
    g, n, _ = x.shape
    windows = Windows(x.new_ones(g, n, 1), torch.arange(n, device=x.device),
                      x.new_tensor(float('inf')), padding, center_valid)
    return blocked.dpc_knn_blocked(x, counts, k, windows, BLOCK_BUDGET,
                                   False)


def dpc_knn_flops(g: int, n: int, c: int, centers: int) -> int:
    """FLOPs of the op (2 per multiply-add, ``torch.utils.flop_counter``'s
    convention), as the kernels compute them: pass 1 pairs every token with
    every token; pass 2 a row block starting at token s with tokens
    ..s + BLOCK (the denser ones, whole tiles; pruned, pass 2 scans a
    data-dependent part of that, not counted); then the distances to the
    centers (C channels: the norms are added, not multiplied)."""
    denser = sum(min(BLOCK, n - s) * min(n, s + BLOCK)
                 for s in range(0, n, BLOCK))
    return 2 * g * c * (n * n + denser + n * centers)


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


def why_not(task: Task) -> Optional[str]:
    """Why the dispatch does not choose this backend for ``task`` (None:
    it does): the device, what is installed, the dtype the kernels read,
    and the sizes they hold in registers (k, scales)."""
    reason = blocked.why_not(task)  # export or trace: the reference's
    if reason is not None:
        return reason
    device = task.device
    if device is None or device.type != 'cuda':
        kind = 'cpu' if device is None else device.type
        return f'tensors on {kind}: the kernels run on CUDA'
    if triton is None:
        return 'triton is not installed'
    if not HAS_CUSTOM_OP:
        return 'torch.library.custom_op is missing (torch < 2.4)'
    if not torch.cuda.is_available():
        return 'CUDA is not available'
    if task.dtype != torch.float32:
        return f'tokens of {task.dtype}: the kernels read float32 tokens'
    if not 1 <= task.k <= MAX_K:
        return f'k = {task.k}: the kernels keep at most {MAX_K} neighbours'
    if task.scales > MAX_SCALES:
        return (f'{task.scales} scales: the kernels assign at most '
                f'{MAX_SCALES}')
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

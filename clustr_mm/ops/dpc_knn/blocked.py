"""The blocked backend: DPC-kNN in bounded distance blocks, the fast path
of CPUs (and of GPUs without Triton). Same clusters as
:func:`~.reference.dpc_knn_reference`, from the same steps.

* The distance block of a call holds at most ``max_chunk_elems`` elements:
  when the windows' whole blocks exceed it, rows are taken in blocks. Then
  the nearest denser token is found with the tokens in density order, so a
  row block needs only the columns before it (half the distance work).
* ``blocked_knn`` finds the k nearest among the blocks of 64 columns with
  the smallest minima (fewer comparisons on long rows, more ops).
* On the CPU, distance blocks are written into a reused per-thread buffer.
"""
import math
import threading
from typing import Optional, Sequence

import torch

from ...graph_safety import is_onnx_export, is_tracing
from .common import ClusteringPlan, Task, Windows, concat_chunks
from .reference import (augment, centers_by_score, density, first_duplicate,
                        gather_columns, nearest_center, record)

NAME = 'blocked'
# holds distance blocks: the dispatch gives it as many windows per call as
# fit the plan's max_chunk_elems
HOLDS_BLOCKS = True

_scratch = threading.local()
_SCRATCH_LIMIT = 1 << 24  # elements (64 MB) a CPU thread may keep for reuse


def _distance_chunk(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.bmm(a, b)``; on the CPU written into a reused per-thread buffer.

    A fresh multi-megabyte block per call costs first-touch page faults
    every time (glibc returns large freed blocks to the kernel): measured up
    to 40% of a stage-2 clustering at 224x224 on a 2-core CPU. Blocks up to
    64 MB reuse one buffer, and each is consumed before the next is made.
    Accelerators have caching allocators and get a plain ``bmm``, as do
    traces (dynamo).
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


def k_smallest(d: torch.Tensor, k: int, block: int = 64) -> torch.Tensor:
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


def why_not(task: Task) -> Optional[str]:
    """Why the dispatch does not choose this backend for ``task`` (None: it
    does): an export or a trace records the reference's operations; any
    device, dtype and size otherwise."""
    if is_onnx_export():
        return ('torch.onnx.export is running: the exporters take the '
                "reference's operations")
    if torch.jit.is_tracing():
        return ('torch.jit.trace is recording: the trace records the '
                "reference's GEMMs")
    return None


def run(x: torch.Tensor, counts: Sequence[int], k: int, windows: Windows,
        plan: ClusteringPlan) -> torch.Tensor:
    """The backend call (see :mod:`.dispatch`): :func:`dpc_knn_blocked`
    with the plan's block budget and kNN."""
    return dpc_knn_blocked(x, counts, k, windows, plan.max_chunk_elems,
                           plan.blocked_knn)


def probed(x: torch.Tensor, counts: Sequence[int], k: int, windows: Windows,
           plan: ClusteringPlan):
    """:func:`run`'s ids and the intermediate values (``probe`` of
    :func:`~.reference.dpc_knn_reference`): the oracle of the first-use
    check (:mod:`.first_use`)."""
    probe = {}
    ids = dpc_knn_blocked(x, counts, k, windows, plan.max_chunk_elems,
                          plan.blocked_knn, probe)
    return ids, probe


def dpc_knn_blocked(x: torch.Tensor, counts: Sequence[int], k: int,
                    windows: Windows, max_chunk_elems: int,
                    blocked_knn: bool,
                    probe: Optional[dict] = None) -> torch.Tensor:
    """DPC-kNN of G windows (arguments, ``probe`` and result as
    :func:`~.reference.dpc_knn_reference`) in blocks of at most
    ``max_chunk_elems`` distances."""
    g, n, c = x.shape
    k_eff = min(k, n)
    inf = float('inf')
    invalid = windows.invalid
    rows, cols, tie = augment(x, windows.ones, invalid)
    # Rows of one block; < n when the windows' whole blocks exceed the budget.
    step = n if g * n * n <= max_chunk_elems else max(
        1, max_chunk_elems // (g * n))

    def knn(d):
        return (k_smallest(d, k_eff) if blocked_knn else
                d.topk(k_eff, dim=-1, largest=False).values)

    # Pass 1: the k nearest (self included) per token, the largest distance.
    row_max, knn_d, first, whole = [], [], [], None
    for r0 in range(0, n, step):
        d = _distance_chunk(rows[:, r0:r0 + step], cols)
        d.diagonal(offset=r0, dim1=1, dim2=2).zero_()
        knn_d.append(knn(d))
        first.append(first_duplicate(d, tie[:, r0:r0 + step]))
        if invalid is not None:  # distances to/from padding leave the max
            d = d.nan_to_num_(posinf=0.0)
        row_max.append(d.amax((1, 2))[:, None] if step >= n else d.amax(-1))
        whole = d if step >= n else None
    row_max = concat_chunks(row_max)
    dmax2 = row_max[:, 0] if row_max.shape[1] == 1 else row_max.amax(-1)
    knn_d, first = concat_chunks(knn_d), concat_chunks(first)
    record(probe, knn=knn_d)
    rho = density(knn_d, tie, c, windows, first)

    # Density order, ties to the lower index; "denser" = earlier in order.
    order = torch.sort(rho, dim=1, descending=True, stable=True).indices

    # Pass 2: distance to the nearest denser token, for every token (padding
    # is never denser than a real token).
    if whole is not None:  # the block is still there: mask by rank
        rank = order.argsort(dim=1)
        delta2 = whole.masked_fill_(rank[:, None, :] >= rank[:, :, None],
                                    inf).amin(-1)
    else:
        delta2 = _nearest_denser(rows, cols, order, step, windows.positions)
    centers = centers_by_score(rho, delta2, dmax2, tie, c, max(counts),
                               windows)
    record(probe, first=first, rho=rho, delta2=delta2, dmax2=dmax2,
           centers=centers)

    # Every token joins its nearest center, row block by row block.
    center_cols = gather_columns(cols, centers)
    return concat_chunks([
        nearest_center(torch.bmm(rows[:, r0:r0 + step], center_cols),
                       tie[:, r0:r0 + step], centers,
                       windows.positions[r0:r0 + step], counts, windows)
        for r0 in range(0, n, step)], 2)


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
    by_order = concat_chunks(parts)  # back from density order to token order
    return torch.empty_like(by_order).scatter_(1, order, by_order)

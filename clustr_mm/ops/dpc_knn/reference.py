"""The reference backend: DPC-kNN of G windows as the paper states it,
and the steps every backend shares.

:func:`dpc_knn_reference` is the algorithm in the paper's five steps over
whole distance blocks; it is the test oracle and what ``torch.jit.trace``
(the FLOP counters) records. The other backends (:mod:`.blocked`: bounded
blocks for CPUs and GPUs without Triton; :mod:`.fused`: Triton kernels that
never write the distance block) call the same steps and give the same
clusters; :mod:`.dispatch` chooses among them.

Every backend takes G windows of n tokens, ``x`` (G, n, C) fp32 with zeros
at padded positions, and their :class:`~.common.Windows`; a padded position
is infinitely far from everything and less dense than any token.

Ties. Distances come from one GEMM, ``|a|^2 + |b|^2 - 2 a.b``, whose
round-off depends on how the GEMM is blocked, hence on the batch. So that
identical tokens are exactly 0 apart whatever the batch, a squared distance
from token a at most :func:`tie_tolerance` ``(C) * |a|^2`` counts as 0 (the
worst-case round-off of that GEMM and of ``|a|^2``, so two identical tokens
always fall below it). Tokens nearer than that are treated as identical:
for C = 64 a squared distance below 3e-5 |a|^2, i.e. closer than 0.6% of
the token's norm; identical tokens share the density of the first of them.
Ties are then broken by token index: the lower index is denser, the
better-scored center wins.
"""
from typing import Optional, Sequence, Tuple

import torch

from .common import ClusteringPlan, Task, Windows

NAME = 'reference'
# holds whole distance blocks: the dispatch gives it as many windows per
# call as fit the plan's max_chunk_elems
HOLDS_BLOCKS = True

PRECISIONS = ('ieee', 'tf32x3')
# ClusTR's default for the fused kernels' products: 3xTF32 changes ids about
# as often as summing fp32 in another order does (docs/backbones.md)
DEFAULT_PRECISION = 'tf32x3'


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else ValueError."""
    if precision not in PRECISIONS:
        raise ValueError(f'precision must be one of {PRECISIONS}, got '
                         f'{precision!r}')
    return precision


def tie_tolerance(channels: int, precision: str = 'ieee') -> float:
    """Relative bound below which a squared distance counts as 0.

    'ieee': recursive summation of the C + 2 products of the GEMM, and of
    the C squares of ``|a|^2``, errs by at most (C + 2) u times the sum of
    the magnitudes, which is at most 4 |a|^2 for two identical tokens a
    (u = 2^-24); twice that for margin: 8 (C + 2) u.

    'tf32x3' (the fused kernels' 3xTF32 products): a = hi + lo + e with hi,
    lo tf32 (10 explicit bits, rounded: |lo| <= 2^-11 |a|, |e| <= 2^-22
    |a|); hi*hi + hi*lo + lo*hi misses lo*lo and the e terms, at most
    3 * 2^-22 = 12u of |a_i b_i| per product (exact in fp32), and the 3C
    products summed in fp32 err by 3C u', u' = 2u allowing a truncating
    tensor-core adder: a.b errs by (6C + 12) u |a|^2 for a = b. With |a|^2,
    |b|^2 (IEEE, C u each) and the two final operations (4u): (14C + 28) u,
    twice for margin: 28 (C + 2) u, 3.5 times the IEEE bound. (A
    truncating split, |lo| <= 2^-10 |a|, makes the first term 48u: still
    inside for C >= 4.)
    """
    scale = 28 if check_precision(precision) == 'tf32x3' else 8
    return scale * (channels + 2) * 2.0**-24


def augment(x: torch.Tensor, ones: Optional[torch.Tensor] = None,
            padding: Optional[torch.Tensor] = None, precision: str = 'ieee'
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows [x, |x|^2, 1], columns [-2x, 1, |x|^2]^T (G, C + 2, M), so that
    ``bmm(rows, cols)`` gives every squared distance, and the tie threshold
    (G, M) of each token (see :func:`tie_tolerance`; ``precision``: that of
    the products the distances come from).

    ``ones``: a cached (G, M, 1) tensor of ones, if there is one.
    ``padding``: (G, M) bool; a padded position (x = 0) gets |x|^2 = +inf,
    so every distance to or from it is +inf straight out of the GEMM (the
    inf only ever meets the constant 1, never a 0, so no NaN).
    """
    sq = x.pow(2).sum(-1, keepdim=True)
    tie = sq[..., 0] * tie_tolerance(x.shape[-1], precision)
    if padding is not None:
        sq = sq.masked_fill(padding[..., None], float('inf'))
    if ones is None:
        ones = torch.ones_like(sq)
    return (torch.cat([x, sq, ones], -1),
            torch.cat([-2 * x, ones, sq], -1).transpose(1, 2), tie)


def tf32_split(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``x`` -> (hi, lo), tf32 values (10 explicit mantissa bits,
    rounded to nearest, ties away from zero like ``cvt.rna.tf32.f32``) with
    hi + lo ~= x: the operand split of 3xTF32, for emulating it in torch."""
    def tf32(v):
        bits = v.contiguous().view(torch.int32)
        # the magnitude is in the low 31 bits: adding half an ulp of tf32
        # and clearing the 13 dropped bits rounds it (finite values)
        return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    hi = tf32(x)
    return hi, tf32(x - hi)


def tf32x3_bmm(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``bmm(rows, cols)`` of :func:`augment`'s operands (C + 2 channels)
    with the fused kernels' 'tf32x3' arithmetic, emulated: the C channel
    products as hi*hi + hi*lo + lo*hi (each exact in fp32, summed in fp32),
    the two norm channels in fp32, as the kernels add them."""
    c = rows.shape[-1] - 2
    (ah, al), (bh, bl) = tf32_split(rows[..., :c]), tf32_split(cols[:, :c])
    dot = torch.bmm(al, bh) + torch.bmm(ah, bl) + torch.bmm(ah, bh)
    return dot + torch.bmm(rows[..., c:], cols[:, c:])


def snap_ties(d: torch.Tensor, tie: torch.Tensor) -> torch.Tensor:
    """Squared distances at most ``tie`` (broadcast: the row token's
    threshold) -> 0, in place; also clears negative round-off."""
    return d.masked_fill_(d <= tie, 0.0)


def first_duplicate(d: torch.Tensor, tie: torch.Tensor) -> torch.Tensor:
    """(G, r) lowest column index within the tie threshold of each row of
    the (G, r, n) squared distances (the row's own column at the latest)."""
    return (d <= tie[..., None]).to(torch.uint8).argmax(-1)


def density(knn_d: torch.Tensor, tie: torch.Tensor, channels: int,
            windows: Windows, first: torch.Tensor) -> torch.Tensor:
    """Step 2: rho = exp(-mean of the k smallest squared distances / C).

    ``knn_d`` (G, n, k) ascending; +inf entries (windows with fewer than k
    tokens) leave the mean, which is taken over the real neighbours.
    Identical tokens take the density of the first of them (``first``
    (G, n), :func:`first_duplicate`): their neighbours beyond each other
    are the same tokens, but round-off could still rank them apart.
    Padding is least dense (-1).
    """
    if windows.knn_scale is not None:
        knn_d = knn_d.nan_to_num(posinf=0.0)
    mean = snap_ties(knn_d, tie[..., None]).mean(-1)
    if windows.knn_scale is not None:
        mean = mean * windows.knn_scale
    rho = torch.exp(mean.div_(-channels)).gather(1, first)  # exp(-mean / C)
    if windows.invalid is not None:
        rho = rho.masked_fill_(windows.invalid, -1.0)
    return rho


def precedes(values: torch.Tensor) -> torch.Tensor:
    """(G, n, n) bool: ``[g, i, j]`` = token j comes before token i in the
    descending order of ``values`` (G, n), ties to the lower index.

    The order of ``torch.sort(values, descending=True, stable=True)`` as
    pairwise comparisons (for values without NaN): the reference uses it
    instead of a stable sort, which the ONNX exporters do not take (ONNX has
    no stable sort), with the same result; it costs an (n, n) block, as the
    reference's distances do.
    """
    vi, vj = values[:, :, None], values[:, None, :]
    n = values.shape[1]
    lower = torch.ones(n, n, dtype=torch.bool,
                       device=values.device).tril(-1)  # [i, j]: j < i
    return (vj > vi) | ((vj == vi) & lower)


def descending_order(values: torch.Tensor, num: int,
                     pairwise: bool = False) -> torch.Tensor:
    """(G, num) indices of the ``num`` largest of ``values`` (G, n), in
    descending order, ties to the lower index (a stable sort's order).

    ``pairwise``: from :func:`precedes` (an (n, n) block, no sort: what the
    reference, and so an exported graph, uses) instead of ``torch.sort``.
    """
    if not pairwise:
        return torch.sort(values, dim=1, descending=True,
                          stable=True).indices[:, :num]
    # rank[i] = tokens preceding i, a permutation of 0..n-1; order[rank[i]] = i
    rank = precedes(values).sum(-1)
    positions = torch.arange(values.shape[1], device=values.device)
    order = torch.zeros_like(rank).scatter_(
        1, rank, positions.expand_as(rank))
    return order[:, :num]


def centers_by_score(rho: torch.Tensor, delta2: torch.Tensor,
                     dmax2: torch.Tensor, tie: torch.Tensor, channels: int,
                     num: int, windows: Windows, pairwise: bool = False
                     ) -> torch.Tensor:
    """Step 4: score = rho * delta, the ``num`` best tokens (G, num).

    ``delta2`` (G, n): squared distance to the nearest denser token (+inf for
    the densest, which gets the window's largest distance ``dmax2`` (G,)).
    ``pairwise``: see :func:`descending_order`.
    """
    delta2 = snap_ties(torch.minimum(delta2, dmax2[:, None]), tie)
    score = rho * delta2.div_(channels).sqrt_()
    if windows.invalid is not None:
        score = score.masked_fill_(windows.invalid, float('-inf'))
    return descending_order(score, num, pairwise)


def nearest_center(dist: torch.Tensor, tie: torch.Tensor,
                   centers: torch.Tensor, rows: torch.Tensor,
                   counts: Sequence[int], windows: Windows) -> torch.Tensor:
    """Step 5: (G, r, K) squared distances of r tokens to the centers ->
    (S, G, r) index of the nearest center per scale.

    ``rows`` (r,) are the tokens' positions in their window: a center joins
    itself (-inf at its own slot, seen by every scale it belongs to).
    argmin takes the first minimum, so the better center wins ties; slots
    that are not centers of a scale are +inf for it.
    """
    dist = snap_ties(dist, tie[..., None])
    dist = dist.masked_fill_(centers[:, None, :] == rows[:, None],
                             float('-inf'))
    if len(counts) == 1 and windows.center_slots is None:
        return dist[..., :counts[0]].argmin(-1)[None]
    return torch.where(windows.center_slots[:, :, None, :], dist,
                       windows.inf).argmin(-1)


def gather_columns(cols: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Columns (G, C + 2, n) of the tokens ``index`` (G, K) -> (G, C + 2, K)."""
    return cols.gather(2, index[:, None, :].expand(-1, cols.shape[1], -1))


def record(probe: Optional[dict], **values: torch.Tensor) -> None:
    """Copy a backend's intermediate values into ``probe`` (when one is
    given): ``knn`` (G, n, k) the k smallest squared distances before step 2
    snaps ties, ``first`` (G, n) first duplicate, ``rho`` (G, n),
    ``delta2`` (G, n) squared distance to the nearest denser token,
    ``dmax2`` (G,), ``centers`` (G, K); for comparing backends
    (:mod:`.agreement`)."""
    if probe is not None:
        probe.update((k, v.clone()) for k, v in values.items())


def dpc_knn_reference(x: torch.Tensor, counts: Sequence[int], k: int,
                      windows: Windows, emulate: str = 'ieee',
                      probe: Optional[dict] = None) -> torch.Tensor:
    """DPC-kNN of G windows in the paper's five steps, whole blocks.

    Args:
        x: (G, n, C) fp32 tokens, zero at padded positions.
        counts: Clusters per scale (the most any window gets); scale s uses
            the first ``counts[s]`` centers, so the scales are nested.
        k: Neighbours of the density (the token itself included).
        windows: The windows' :class:`~.common.Windows`.
        emulate: 'tf32x3' computes step 1's distances with
            :func:`tf32x3_bmm` and the tie threshold of that precision,
            like the fused op in that mode (the precision check,
            ``tools/analysis/precision_check.py``); the dispatch never sets
            it, the reference is IEEE fp32.
        probe: A dict to fill with the intermediate values (:func:`record`).

    Returns:
        (S, G, n) index of every token's center among the window's centers
        (ranked by score), per scale; padded positions get arbitrary ids.
    """
    g, n, c = x.shape
    inf = float('inf')
    # 1. Pairwise squared distances (padding: +inf; self: exactly 0).
    rows, cols, tie = augment(x, windows.ones, windows.invalid, emulate)
    d2 = (tf32x3_bmm if emulate == 'tf32x3' else torch.bmm)(rows, cols)
    # a mask, not an in-place write to the diagonal view (which the ONNX
    # exporters reject); the same values
    pos = windows.positions
    d2 = d2.masked_fill_(pos[:, None] == pos, 0.0)
    # The window's largest distance (the densest token's delta).
    finite = d2 if windows.invalid is None else d2.nan_to_num(posinf=0.0)
    dmax2 = finite.amax((1, 2))
    # 2. Density from the k nearest, the token itself included.
    knn_d = d2.topk(min(k, n), dim=-1, largest=False).values
    first = first_duplicate(d2, tie)
    record(probe, knn=knn_d)
    rho = density(knn_d, tie, c, windows, first)
    # 3. Distance to the nearest denser token; equal densities: the lower
    # index is denser (pairwise comparisons, see precedes()).
    delta2 = d2.masked_fill(~precedes(rho), inf).amin(-1)
    # 4. Score and centers.
    centers = centers_by_score(rho, delta2, dmax2, tie, c, max(counts),
                               windows, pairwise=True)
    record(probe, first=first, rho=rho, delta2=delta2, dmax2=dmax2,
           centers=centers)
    # 5. Every token joins its nearest center.
    dist = torch.bmm(rows, gather_columns(cols, centers))
    return nearest_center(dist, tie, centers, windows.positions, counts,
                          windows)


def why_not(task: Task) -> Optional[str]:
    """None: the reference runs everywhere (the last backend tried), on
    any device, dtype and size."""
    return None


def run(x: torch.Tensor, counts: Sequence[int], k: int, windows: Windows,
        plan: ClusteringPlan) -> torch.Tensor:
    """The backend call (see :mod:`.dispatch`): :func:`dpc_knn_reference`
    in IEEE fp32 (the plan's layout is already in ``windows``)."""
    return dpc_knn_reference(x, counts, k, windows)

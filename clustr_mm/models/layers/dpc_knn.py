"""DPC-kNN in windows: the reference implementation and what every
implementation shares.

:func:`dpc_knn_reference` is the algorithm as the paper states it, in five
steps over whole distance blocks; it is the test oracle and what
``torch.jit.trace`` (the FLOP counters) records. The fast paths
(``dpc_knn_blocked``: bounded blocks for CPUs and GPUs without Triton;
``dpc_knn_fused``: a Triton kernel that never writes the distance block)
give the same clusters. ``token_clustering`` chooses among them.

All of them take G windows of n tokens, ``x`` (G, n, C) fp32 with zeros at
padded positions, and the window constants of
:class:`~.window_layout.WindowBatch`; a padded position is infinitely far
from everything and less dense than any token.

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


def tie_tolerance(channels: int) -> float:
    """Relative bound below which a squared distance counts as 0.

    Recursive summation of the C + 2 products of the GEMM, and of the C
    squares of ``|a|^2``, errs by at most (C + 2) u times the sum of the
    magnitudes, which is at most 4 |a|^2 for two identical tokens a
    (u = 2^-24); twice that for margin: 8 (C + 2) u.
    """
    return 8 * (channels + 2) * 2.0**-24


def augment(x: torch.Tensor, ones: Optional[torch.Tensor] = None,
            padding: Optional[torch.Tensor] = None
            ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows [x, |x|^2, 1], columns [-2x, 1, |x|^2]^T (G, C + 2, M), so that
    ``bmm(rows, cols)`` gives every squared distance, and the tie threshold
    (G, M) of each token (see :func:`tie_tolerance`).

    ``ones``: a cached (G, M, 1) tensor of ones, if there is one.
    ``padding``: (G, M) bool; a padded position (x = 0) gets |x|^2 = +inf,
    so every distance to or from it is +inf straight out of the GEMM (the
    inf only ever meets the constant 1, never a 0, so no NaN).
    """
    sq = x.pow(2).sum(-1, keepdim=True)
    tie = sq[..., 0] * tie_tolerance(x.shape[-1])
    if padding is not None:
        sq = sq.masked_fill(padding[..., None], float('inf'))
    if ones is None:
        ones = torch.ones_like(sq)
    return (torch.cat([x, sq, ones], -1),
            torch.cat([-2 * x, ones, sq], -1).transpose(1, 2), tie)


def snap_ties(d: torch.Tensor, tie: torch.Tensor) -> torch.Tensor:
    """Squared distances at most ``tie`` (broadcast: the row token's
    threshold) -> 0, in place; also clears negative round-off."""
    return d.masked_fill_(d <= tie, 0.0)


def first_duplicate(d: torch.Tensor, tie: torch.Tensor) -> torch.Tensor:
    """(G, r) lowest column index within the tie threshold of each row of
    the (G, r, n) squared distances (the row's own column at the latest)."""
    return (d <= tie[..., None]).to(torch.uint8).argmax(-1)


def density(knn_d: torch.Tensor, tie: torch.Tensor, channels: int,
            consts, first: torch.Tensor) -> torch.Tensor:
    """Step 2: rho = exp(-mean of the k smallest squared distances / C).

    ``knn_d`` (G, n, k) ascending; +inf entries (windows with fewer than k
    tokens) leave the mean, which is taken over the real neighbours.
    Identical tokens take the density of the first of them (``first``
    (G, n), :func:`first_duplicate`): their neighbours beyond each other
    are the same tokens, but round-off could still rank them apart.
    Padding is least dense (-1).
    """
    if consts.knn_scale is not None:
        knn_d = knn_d.nan_to_num(posinf=0.0)
    mean = snap_ties(knn_d, tie[..., None]).mean(-1)
    if consts.knn_scale is not None:
        mean = mean * consts.knn_scale
    rho = torch.exp(mean.div_(-channels)).gather(1, first)  # exp(-mean / C)
    if consts.invalid is not None:
        rho = rho.masked_fill_(consts.invalid, -1.0)
    return rho


def centers_by_score(rho: torch.Tensor, delta2: torch.Tensor,
                     dmax2: torch.Tensor, tie: torch.Tensor, channels: int,
                     num: int, consts) -> torch.Tensor:
    """Step 4: score = rho * delta, the ``num`` best tokens (G, num).

    ``delta2`` (G, n): squared distance to the nearest denser token (+inf for
    the densest, which gets the window's largest distance ``dmax2`` (G,)).
    """
    delta2 = snap_ties(torch.minimum(delta2, dmax2[:, None]), tie)
    score = rho * delta2.div_(channels).sqrt_()
    if consts.invalid is not None:
        score = score.masked_fill_(consts.invalid, float('-inf'))
    return torch.sort(score, dim=1, descending=True,
                      stable=True).indices[:, :num]


def nearest_center(dist: torch.Tensor, tie: torch.Tensor,
                   centers: torch.Tensor, rows: torch.Tensor,
                   counts: Sequence[int], consts) -> torch.Tensor:
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
    if len(counts) == 1 and consts.center_valid is None:
        return dist[..., :counts[0]].argmin(-1)[None]
    return torch.where(consts.center_valid[:, :, None, :], dist,
                       consts.inf).argmin(-1)


def gather_columns(cols: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Columns (G, C + 2, n) of the tokens ``index`` (G, K) -> (G, C + 2, K)."""
    return cols.gather(2, index[:, None, :].expand(-1, cols.shape[1], -1))


def dpc_knn_reference(x: torch.Tensor, counts: Sequence[int], k: int,
                      consts) -> torch.Tensor:
    """DPC-kNN of G windows in the paper's five steps, whole blocks.

    Args:
        x: (G, n, C) fp32 tokens, zero at padded positions.
        counts: Clusters per scale (the most any window gets); scale s uses
            the first ``counts[s]`` centers, so the scales are nested.
        k: Neighbours of the density (the token itself included).
        consts: The windows' :class:`~.window_layout.WindowBatch`.

    Returns:
        (S, G, n) index of every token's center among the window's centers
        (ranked by score), per scale; padded positions get arbitrary ids.
    """
    g, n, c = x.shape
    inf = float('inf')
    # 1. Pairwise squared distances (padding: +inf; self: exactly 0).
    rows, cols, tie = augment(x, consts.ones, consts.invalid)
    d2 = torch.bmm(rows, cols)
    d2.diagonal(dim1=1, dim2=2).zero_()
    # The window's largest distance (the densest token's delta).
    finite = d2 if consts.invalid is None else d2.nan_to_num(posinf=0.0)
    dmax2 = finite.amax((1, 2))
    # 2. Density from the k nearest, the token itself included.
    knn_d = d2.topk(min(k, n), dim=-1, largest=False).values
    rho = density(knn_d, tie, c, consts, first_duplicate(d2, tie))
    # 3. Distance to the nearest denser token; equal densities: the lower
    # index is denser.
    order = torch.sort(rho, dim=1, descending=True, stable=True).indices
    rank = order.argsort(dim=1)
    not_denser = rank[:, None, :] >= rank[:, :, None]
    delta2 = d2.masked_fill(not_denser, inf).amin(-1)
    # 4. Score and centers.
    centers = centers_by_score(rho, delta2, dmax2, tie, c, max(counts),
                               consts)
    # 5. Every token joins its nearest center.
    dist = torch.bmm(rows, gather_columns(cols, centers))
    return nearest_center(dist, tie, centers, consts.positions, counts,
                          consts)

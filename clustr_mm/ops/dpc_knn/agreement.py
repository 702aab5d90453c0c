"""Do two DPC-kNN implementations agree on the same windows, up to round-off?

Two fp32 implementations (the fused kernels and the reference or blocked
path) sum their distance products in different orders, so their values
differ by round-off and a decision that the reference itself makes by a
margin smaller than that round-off (a near-tie) may go either way. This
module bounds the round-off, finds the reference's near-ties, and compares:
the intermediate values within the bound, the ids exactly except where a
near-tie explains the difference (:func:`compare`). The tests of the
fused op and its first-use check (:mod:`.first_use`) both use it.

The bounds (u = 2^-24, C channels, a and b tokens of one window, M the
largest token norm of the window):

* Squared distance ``|a|^2 + |b|^2 - 2 a.b``: an IEEE fp32 evaluation in any
  summation order errs by at most (C + 2) u (|a| + |b|)^2 in its products
  and sums and C u (|a|^2 + |b|^2) in its norms: 2 (C + 2) u (|a| + |b|)^2.
  The 'tf32x3' kernels err by at most 4 (C + 2) u (|a| + |b|)^2 (the
  product bound of :func:`~.reference.tie_tolerance` for a != b, plus the
  norms). Two evaluations: ``s (C + 2) u (|a| + |M|)^2`` per row a, s = 4
  (ieee) or 6 ('tf32x3'), plus the row's tie threshold (one may snap a
  value to 0 that the other keeps). Every k-smallest value, the nearest
  denser distance (same denser set) and the window's largest distance move
  by at most this (order statistics and minima are 1-Lipschitz).
* Density ``exp(-s_k mean / C)``: the mean of the k values moves by the row
  bound plus 2 (k + 2) u mean (its own round-off, both sides); the density
  by ``rho * expm1(s_k * that / C)`` plus 8 u rho (exp and the divisions).
* Score ``rho * sqrt(delta2 / C)``: an interval from those of rho and of
  delta2; a token whose density is within the bound of another token that
  is nearer than its nearest denser one (plus the bound) may get another
  nearest denser token: its delta2 is only known to lie between that
  distance and the window's largest.

Near-ties of the reference: a center rank whose token's score interval
overlaps that of a token ranked on the other side of it; a token whose two
nearest centers are within twice its bound; a window with a pair of tokens
whose duplicate status is within round-off of the tie threshold (its whole
clustering is then counted as a near-tie, compared only in pass 1). A pair
at most half the threshold apart counts as duplicates in every
implementation: the threshold is twice the worst-case round-off of two
identical tokens, so this is where identical tokens fall.
"""
from typing import Dict, Optional, Sequence

import torch

from .common import Windows
from .reference import augment, tie_tolerance

U = 2.0**-24
# s of the module docstring: the distance bound of two evaluations, in
# (C + 2) u (|a| + M)^2
SCALE = {'ieee': 4.0, 'tf32x3': 6.0}


def row_tolerance(x: torch.Tensor, invalid: Optional[torch.Tensor],
                  precision: str = 'ieee') -> torch.Tensor:
    """(G, n) bound on the difference of two implementations' squared
    distances from each token (``precision``: the fused kernels')."""
    c = x.shape[-1]
    norm = x.norm(dim=-1)
    if invalid is not None:
        norm = norm.masked_fill(invalid, 0.0)
    top = norm.amax(-1, keepdim=True)
    tie = norm.square() * tie_tolerance(c, precision)
    return SCALE[precision] * (c + 2) * U * (norm + top).square() * 1.01 + tie


def _ratio(got: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor,
           mask: torch.Tensor) -> float:
    """Largest |got - ref| / tol over ``mask`` (inf where only one side is
    infinite); 0 if nothing is compared."""
    both_inf = torch.isinf(got) & torch.isinf(ref) & (got == ref)
    diff = (got - ref).abs().masked_fill(both_inf, 0.0)
    ratio = (diff / tol.clamp_min(torch.finfo(tol.dtype).tiny)
             ).masked_fill(~mask, 0.0)
    return float(ratio.max()) if ratio.numel() else 0.0


def compare(x: torch.Tensor, counts: Sequence[int], windows: Windows,
            ref: Dict[str, torch.Tensor], got: Dict[str, torch.Tensor],
            ref_ids: torch.Tensor, got_ids: torch.Tensor,
            precision: str = 'ieee') -> Dict[str, float]:
    """How far ``got`` (probe and ids of the implementation under test) is
    from ``ref`` (those of an IEEE fp32 one) on the windows ``x`` (G, n, C)
    described by ``windows`` (:class:`~.common.Windows`).

    Returns a dict: ``knn``, ``rho``, ``delta2``: the largest difference as
    a fraction of its bound (<= 1 agrees); ``near_tie_windows``,
    ``fragile_delta`` (tokens), ``fragile_ranks`` (center ranks),
    ``assignment_ties`` (token ids): the reference's near-ties;
    ``center_mismatches`` (at ranks that are not near-ties),
    ``id_mismatches`` and ``unexplained_ids`` (not explained by a
    near-tie); ``agree``: everything within its bound, no unexplained
    difference. Host syncs: for tests and one-time checks only.
    """
    g, n, c = x.shape
    invalid = windows.invalid
    valid = (torch.ones(g, n, dtype=torch.bool, device=x.device)
             if invalid is None else ~invalid)
    tol = row_tolerance(x, invalid, precision)
    _, _, tie_lo = augment(x, None, invalid, 'ieee')
    tie_hi = tie_lo * (tie_tolerance(c, precision) / tie_tolerance(c))
    knn_r, knn_g = ref['knn'], got['knn']
    # duplicate status within round-off of the tie threshold: the window's
    # densities are not comparable (counted, not compared)
    norm = x.norm(dim=-1)
    tol_dup = (SCALE[precision] * (c + 2) * U * 1.01
               * (2 * norm + tie_hi.sqrt()).square())
    band = ((knn_r > tie_lo[..., None] / 2)
            & (knn_r <= (tie_hi + tol_dup)[..., None]) & valid[..., None])
    dup_window = band.flatten(1).any(1)
    ok = valid & ~dup_window[:, None]
    out = dict(knn=_ratio(knn_g, knn_r, tol[..., None], valid[..., None]))

    # densities
    k = knn_r.shape[-1]
    mean = knn_r.nan_to_num(posinf=0.0).mean(-1)
    scale = (torch.ones_like(mean) if windows.knn_scale is None else
             windows.knn_scale.expand_as(mean))
    tol_mean = tol + 2 * (k + 2) * U * mean
    rho_r = ref['rho']
    tol_rho = (rho_r * torch.expm1(scale * tol_mean / c) + 8 * U * rho_r
               ).gather(1, ref['first'])
    out['rho'] = _ratio(got['rho'], rho_r, tol_rho, ok)

    # nearest denser token: fragile where a density near-tie reaches a
    # token nearer than it
    rep = ok & (ref['first'] == torch.arange(n, device=x.device))
    d_p = _near_tie_distances(x, rho_r, tol_rho, rep, invalid)
    delta_r = ref['delta2']
    fragile = rep & (d_p <= delta_r + tol)
    out['delta2'] = _ratio(got['delta2'], delta_r, tol, ok & ~fragile)
    out['fragile_delta'] = int(fragile.sum())

    # score intervals and the center ranks they leave certain
    dmax2 = ref['dmax2'][:, None]
    tol_max = tol.masked_fill(~valid, 0.0).amax(-1, keepdim=True)
    clamped = delta_r >= dmax2
    d_eff = torch.minimum(delta_r, dmax2)
    t_eff = torch.where(clamped, tol_max, tol)
    lo, hi = d_eff - t_eff, d_eff + t_eff
    if out['fragile_delta']:
        f_lo, f_hi = _fragile_delta_bounds(x, fragile, rho_r, tol_rho, ok)
        lo = torch.where(fragile, torch.minimum(f_lo, dmax2) - tol_max, lo)
        hi = torch.where(fragile, torch.minimum(f_hi, dmax2) + tol_max, hi)
    lo = lo.masked_fill(lo <= tie_hi, 0.0).clamp_min(0.0)
    s_lo = (rho_r - tol_rho) * (lo / c).sqrt() * (1 - 4 * U)
    s_hi = (rho_r + tol_rho) * (hi / c).sqrt() * (1 + 4 * U)
    s_lo = s_lo.masked_fill(~valid, float('-inf'))
    s_hi = s_hi.masked_fill(~valid, float('-inf'))
    centers_r = ref['centers']
    kk = centers_r.shape[1]
    order = centers_r  # the reference's ranking, top K
    rest = torch.ones(g, n, dtype=torch.bool, device=x.device)
    rest.scatter_(1, order, False)
    below_rest = s_hi.masked_fill(~rest, float('-inf')).amax(-1)  # (G,)
    lo_k, hi_k = s_lo.gather(1, order), s_hi.gather(1, order)
    # largest upper bound ranked below rank r, smallest lower bound above
    below = torch.cat([hi_k.flip(1).cummax(1).values.flip(1)[:, 1:],
                       below_rest[:, None].expand(g, 1)], 1)
    below = torch.maximum(below, below_rest[:, None])
    above = torch.cat([torch.full_like(lo_k[:, :1], float('inf')),
                       lo_k.cummin(1).values[:, :-1]], 1)
    fragile_rank = (below >= lo_k) | (above <= hi_k) | dup_window[:, None]
    slots = torch.arange(kk, device=x.device)
    if windows.center_slots is None:
        real = (slots < counts[0])[None, None].expand(len(counts), g, kk)
    else:
        real = windows.center_slots
    used = real.any(0)
    out['fragile_ranks'] = int((fragile_rank & used).sum())
    out['center_mismatches'] = int(
        ((got['centers'] != centers_r) & used & ~fragile_rank).sum())

    # ids: a difference is explained by a fragile rank (either side's id)
    # or by a token's two nearest centers within twice its bound
    rows, cols, tie = augment(x, None, invalid)
    cc = cols.gather(2, centers_r[:, None, :].expand(-1, cols.shape[1], -1))
    dist = torch.bmm(rows, cc).masked_fill_(
        centers_r[:, None, :] == torch.arange(n, device=x.device)[:, None],
        float('-inf'))
    dist = dist.masked_fill_(dist <= tie[..., None], 0.0)
    unexplained = mismatches = ties = 0
    for s in range(len(counts)):
        d = dist.masked_fill(~real[s][:, None, :], float('inf'))
        two = d.topk(min(2, kk), -1, largest=False).values
        near = ((two[..., -1] - two[..., 0] <= 2 * tol) if kk > 1 else
                torch.zeros_like(valid)) & valid
        fr = fragile_rank & real[s]
        hit = (fr.gather(1, ref_ids[s].clamp(0, kk - 1))
               | fr.gather(1, got_ids[s].clamp(0, kk - 1)))
        diff = (ref_ids[s] != got_ids[s]) & valid
        mismatches += int(diff.sum())
        ties += int((near & ~hit).sum())
        unexplained += int((diff & ~hit & ~near
                            & ~dup_window[:, None]).sum())
    out.update(near_tie_windows=int(dup_window.sum()), assignment_ties=ties,
               id_mismatches=mismatches, unexplained_ids=unexplained)
    out['agree'] = (max(out['knn'], out['rho'], out['delta2']) <= 1.0
                    and out['center_mismatches'] == 0
                    and unexplained == 0)
    return out


def _near_tie_distances(x: torch.Tensor, rho: torch.Tensor,
                        tol_rho: torch.Tensor, rep: torch.Tensor,
                        invalid: Optional[torch.Tensor]) -> torch.Tensor:
    """(G, n) smallest squared distance from each token to another whose
    density is within both bounds of its own (+inf if none), among the
    tokens ``rep`` (first of their duplicates, real): the tokens that may
    change sides of it between two implementations."""
    g, n, c = x.shape
    inf = float('inf')
    key = rho.masked_fill(~rep, -inf)
    srt, order = key.sort(1, descending=True)
    t_s = tol_rho.gather(1, order).masked_fill(~rep.gather(1, order), 0.0)
    t_max = t_s.amax(1, keepdim=True)
    # how far down the sorted densities a token's near-ties can reach
    neg = (-srt).contiguous()
    reach = torch.searchsorted(neg, (-(srt - t_s - t_max)).contiguous(),
                               right=True)
    pos = torch.arange(n, device=x.device)
    reach = torch.where(torch.isfinite(srt), reach, pos + 1)
    width = int((reach - pos).amax())
    best = torch.full((g, n), inf, device=x.device)
    xs = x.gather(1, order[..., None].expand(-1, -1, c))
    sq = xs.pow(2).sum(-1)
    for o in range(1, max(width, 1)):
        j = (pos + o).clamp_max(n - 1)[None].expand(g, -1)
        near = ((srt - srt.gather(1, j) <= t_s + t_s.gather(1, j))
                & (pos + o < n)[None] & torch.isfinite(srt)
                & torch.isfinite(srt.gather(1, j)))
        if not bool(near.any()):
            continue
        xj = xs.gather(1, j[..., None].expand(-1, -1, c))
        d = (sq + sq.gather(1, j) - 2 * (xs * xj).sum(-1)).masked_fill(
            ~near, inf)
        best = torch.minimum(best, d)  # for the upper token of each pair
        best.scatter_reduce_(1, j, d, 'amin')  # and the lower one
    return torch.empty_like(best).scatter_(1, order, best)


def _fragile_delta_bounds(x: torch.Tensor, fragile: torch.Tensor,
                          rho: torch.Tensor, tol_rho: torch.Tensor,
                          ok: torch.Tensor, chunk: int = 64):
    """(G, n) smallest squared distance of each ``fragile`` token to a token
    that may be denser than it in another implementation, and to one that
    is denser in every implementation (+inf if none; other tokens: +inf):
    the range its nearest denser distance can take."""
    g, n, c = x.shape
    inf = float('inf')
    lo = torch.full((g, n), inf, device=x.device)
    hi = torch.full((g, n), inf, device=x.device)
    gi, ti = fragile.nonzero(as_tuple=True)
    sq = x.pow(2).sum(-1)
    for s in range(0, len(gi), chunk):
        gs, ts = gi[s:s + chunk], ti[s:s + chunk]
        d = (sq[gs, ts][:, None] + sq[gs] - 2 * torch.bmm(
            x[gs], x[gs, ts][:, :, None])[..., 0])
        d[torch.arange(len(gs)), ts] = inf  # not itself
        d = d.masked_fill(~ok[gs], inf)
        r, t = rho[gs, ts][:, None], tol_rho[gs, ts][:, None]
        maybe = rho[gs] + tol_rho[gs] >= r - t
        surely = rho[gs] - tol_rho[gs] > r + t
        lo[gs, ts] = d.masked_fill(~maybe, inf).amin(-1)
        hi[gs, ts] = d.masked_fill(~surely, inf).amin(-1)
    return lo, hi

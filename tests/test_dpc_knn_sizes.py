"""The fused DPC-kNN kernels, run by Triton's interpreter, against the
reference on random-normal fp32 tokens at the sizes ClusTR-S clusters.

Values are compared within the round-off bound derived in
:mod:`clustr_mm.ops.dpc_knn.agreement` (k nearest distances,
densities, distance to the nearest denser token), and ids are equal except
where the reference itself has a near-tie within that bound (counted and
printed as ``[agreement]`` lines). The interpreter runs in this process
(``fused_cases.interpreted``).

Interpreter time on the 2-core development CPU (torch 2.14.1, triton 3.8):
one 3,136-token window takes ~20 s (the per-lane selection is elementwise
numpy), so the slow tier has all three stages at 224 and window mode with
800 x 1344's geometry at a quarter of the window side; its 48 windows of
3,136 tokens (batch 2) are opt in here (``CLUSTR_MM_INTERPRET_BIG=1``) and
run in the CUDA tier (``test_cuda.py``).
"""
import json
import time

import pytest
import torch

from clustr_mm.registry import switch

from fused_cases import (EXACT_224, ID_SLACK_PCT, WINDOW_800,
                         fused_agreement, interpreted, needs_triton, windows)

BIG = pytest.mark.skipif(
    not switch('CLUSTR_MM_INTERPRET_BIG', False),
    reason='opt in with CLUSTR_MM_INTERPRET_BIG=1: the interpreter takes '
    '~20 s per 3,136-token window on 2 cores, 48 windows here (the CUDA tier '
    'runs it)')


def run_interpreted(name, hw, window_size, sr_ratio, channels, batch,
                    prune=False):
    """The agreement report of the fused kernels (interpreted; ``prune``:
    pass 2 pruned by pass 1's nearest other token) with the reference on
    one case; printed with its time."""
    from clustr_mm.ops.dpc_knn import fused
    x, counts, consts = windows(hw, window_size, sr_ratio, channels, batch)
    start = time.perf_counter()
    with interpreted(fused):
        report = fused_agreement(x, counts, consts, prune=prune)
    report['seconds'] = round(time.perf_counter() - start, 1)
    report['windows'] = x.shape[0]
    print(f'[agreement] {name}: {json.dumps(report)}')
    return report


def check(report):
    assert report['agree'], report
    # the bound is a worst case; actual round-off is far below it: at most
    # 0.0119 of it measured (fast-12x14-w10, 16 channels; the others here
    # 0.0011-0.0039, the GPU tier's at most 0.0044; 2026-11-27): ~3x that
    assert max(report['knn'], report['rho'], report['delta2']) < 0.035, report
    assert report['center_mismatches'] == 0 and report['unexplained_ids'] == 0
    assert (report['fused_exact_pct']
            <= report['fp32_exact_pct'] + ID_SLACK_PCT), report


@needs_triton
@pytest.mark.parametrize('prune', [False, True], ids=['full', 'pruned'])
def test_small_windows_interpreted(prune):
    """The fast loop's interpreter case: border windows padded, two row
    blocks (the merge kernel), k > tokens of the smallest window; pass 2
    in full and pruned."""
    check(run_interpreted(f'fast-12x14-w10-{"pruned" if prune else "full"}',
                          (12, 14), 10, 2, 16, 1, prune))


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize('size,batch', [('196x256', 2), ('784x128', 1)])
def test_exact_224_stages_interpreted(size, batch):
    hw, channels, sr = EXACT_224[size]
    check(run_interpreted(f'exact-224-{size}-b{batch}', hw, None, sr,
                          channels, batch))


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize('prune', [False, True], ids=['full', 'pruned'])
def test_window_mode_border_windows_interpreted(prune):
    """Window mode at 800 x 1344's stage-1 geometry (full windows, a
    bottom row of border windows padded, batch 2) at a quarter of the
    window side: 14-token windows over 22 x 28 tokens."""
    check(run_interpreted('window-22x28-w14-b2', (22, 28), 14, 8, 64, 2,
                          prune))


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize('prune', [False, True], ids=['full', 'pruned'])
def test_exact_224_stage1_interpreted(prune):
    hw, channels, sr = EXACT_224['3136x64']
    check(run_interpreted('exact-224-3136x64-b1', hw, None, sr, channels, 1,
                          prune))


@BIG
@needs_triton
def test_window_800x1344_stage1_interpreted():
    hw, ws, channels, sr = WINDOW_800
    check(run_interpreted('window-800x1344-s1-b2', hw, ws, sr, channels, 2))


def adversarial_windows(n, c):
    """Four integer-valued windows of n tokens (every fp32 sum exact, so the
    ids must equal the reference's exactly) that stress pass 1's per-lane
    lists: (0) each row's nearest tokens all share its lane (column = row
    mod 32 in every tile); (1) three tokens repeated n / 3 times (more
    duplicates than k); (2) values in {-1, 0, 1} (many equal distances at
    the k-th neighbour); (3) groups of the 2c points +-2 e_i, 100 apart:
    equal densities everywhere, every decision a tie broken by index."""
    import torch
    j = torch.arange(n)
    lane = torch.zeros(n, c)
    lane[j, (j % 32) % c] = 16.0
    lane[j, (32 + j // 32) % c] += 1.0
    dup = torch.zeros(n, c)
    dup[j, j % 3] = 2.0
    gen = torch.Generator().manual_seed(0)
    ints = torch.randint(-1, 2, (n, c), generator=gen).float()
    ties = torch.zeros(n, c)
    within = j % (2 * c)
    ties[j, within % c] = torch.where(within < c, 2.0, -2.0)
    ties[:, 0] += 100.0 * (j // (2 * c)).float()
    return torch.stack([lane, dup, ints, ties])


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize('size,precision,kinds', [
    ('196x256', 'ieee', 4), ('196x256', 'tf32x3', 4), ('784x128', 'ieee', 4),
    ('784x128', 'tf32x3', 4), ('3136x64', 'tf32x3', 2)])
def test_adversarial_windows_equal_reference(size, precision, kinds):
    """At each ClusTR-S stage size, with the precision's tie threshold
    (the interpreter's products are exact here), the fused kernels' ids
    equal the reference's on the first ``kinds`` of
    :func:`adversarial_windows` (stage 1: the default precision and the
    lane and duplicate windows, for time)."""
    import torch

    from clustr_mm.ops.dpc_knn import (FUSED_PLAN, WindowLayout, batch_consts,
                                       fused)
    from clustr_mm.ops.dpc_knn.reference import augment, dpc_knn_reference
    hw, c, sr = EXACT_224[size]
    x = adversarial_windows(hw[0] * hw[1], c)[:kinds]
    layout = WindowLayout(hw, None, sr, plan=FUSED_PLAN)
    (group, ) = layout.groups
    consts = batch_consts(layout, kinds, c).groups[0].windows
    counts = [group.counts[s] for s in layout.clustered]
    ref_probe = {}
    with interpreted(fused):
        got, probe = fused.probed(x, counts, 5, consts,
                                    FUSED_PLAN._replace(precision=precision))
    ref = dpc_knn_reference(x, counts, 5, consts, emulate=precision,
                            probe=ref_probe)
    bad = (got != ref).flatten(1).any(1).nonzero().flatten()
    assert bad.numel() == 0, bad.tolist()  # windows that differ
    # the values too (the k nearest with duplicates as 0, as the kernels
    # keep them; densities up to exp's last bit)
    _, _, tie = augment(x, precision=precision)
    knn = ref_probe['knn'].masked_fill(ref_probe['knn'] <= tie[..., None], 0)
    assert torch.equal(probe['knn'], knn)
    assert torch.equal(probe['first'], ref_probe['first'])
    torch.testing.assert_close(probe['rho'], ref_probe['rho'], rtol=1e-6,
                               atol=0)
    assert torch.equal(probe['centers'], ref_probe['centers'])


def pruned_and_full(x, counts, k, consts, precision):
    """(full, pruned) :func:`fused.probed` of the same windows (the
    pruned layout is ``kernel_config(..., prune=True)``), interpreted."""
    from clustr_mm.ops.dpc_knn import FUSED_PLAN, fused
    plan = FUSED_PLAN._replace(precision=precision)
    config = fused.kernel_config(x.device, x.shape[2], precision)
    with interpreted(fused):
        return [fused.probed(x, counts, k, consts, plan,
                             config._replace(prune_denser=prune))
                for prune in (False, True)]


def assert_same(full, pruned):
    (ids, probe), (pruned_ids, pruned_probe) = full, pruned
    assert torch.equal(pruned_ids, ids)
    for name in ('delta2', 'centers', 'rho', 'knn'):
        assert torch.equal(pruned_probe[name], probe[name]), name


@needs_triton
@pytest.mark.parametrize('kinds,precision', [(4, 'ieee'), (2, 'tf32x3')])
def test_pruned_pass2_equals_the_full_scan_on_adversarial_windows(
        kinds, precision):
    """Pass 2 pruned by pass 1's nearest other token (its nearest denser
    token where that one is denser) gives the full scan's ids, distances
    to the nearest denser token and centers bit for bit, on the windows
    of :func:`adversarial_windows` at stage 3's size: nearest tokens in
    the row's own lane (the unknown case), more duplicates than k, ties at
    the k-th distance and everywhere."""
    from clustr_mm.ops.dpc_knn import FUSED_PLAN, WindowLayout, batch_consts
    hw, c, sr = EXACT_224['196x256']
    x = adversarial_windows(hw[0] * hw[1], c)[:kinds]
    layout = WindowLayout(hw, None, sr, plan=FUSED_PLAN)
    consts = batch_consts(layout, kinds, c).groups[0].windows
    counts = [layout.groups[0].counts[s] for s in layout.clustered]
    assert_same(*pruned_and_full(x, counts, 5, consts, precision))


@needs_triton
@pytest.mark.parametrize('k,precision', [(1, 'ieee'), (2, 'ieee'),
                                         (5, 'ieee'), (5, 'tf32x3')])
def test_pruned_pass2_equals_the_full_scan_on_padded_windows(k, precision):
    """The same on random windows with padded border windows and windows
    of fewer tokens than k, for k = 1 (the row itself only: pass 1 knows
    no other token, nothing is pruned), 2 and 5 (ClusTR's; also in
    'tf32x3', whose wider tie threshold makes more duplicates); and
    :func:`fused._pending_kernel` alone, in steps of 8 positions: it
    settles exactly the tokens whose nearest other token is denser
    (:func:`fused.settled_by_nearest`), writes their distance, and lists
    the others' density-order positions ascending with their number."""
    from clustr_mm.ops.dpc_knn import fused
    x, counts, consts = windows((11, 13), 5, 2, 16, 3)
    full, pruned = pruned_and_full(x, counts, k, consts, precision)
    assert_same(full, pruned)
    config = fused.kernel_config(x.device, 16, precision, prune=True)
    g, n, c = x.shape
    with interpreted(fused):
        hi, lo, sq, tie = fused._prep(x, consts.invalid, precision)
        pass1 = fused._knn_pass(hi, lo, sq, tie, consts.knn_scale,
                                min(k, n), precision, config)
        rho = pass1.rho.gather(1, pass1.first)
        order = torch.sort(rho, dim=1, descending=True, stable=True).indices
        delta2, score, dmax2 = x.new_full((g, n), -7.0), x.new_empty(g, n), \
            x.new_empty(g)
        pending = torch.full((g, n), -7, dtype=torch.int32)
        count = torch.empty(g, dtype=torch.int32)
        fused._pending_kernel[(g, )](
            sq, tie, order, rho, pass1.rowmax, pass1.nearest,
            pass1.nearest_d2, delta2, score, dmax2, pending, count, n, C=c,
            BLOCK=8)  # 25-token windows: four steps
    settled = fused.settled_by_nearest(pass1, rho)
    if k == 1:
        assert not settled.any()
    else:  # most tokens (padding never: its nearest is unknown)
        assert settled.float().mean() > 0.3, settled.float().mean()
    assert torch.equal(delta2[settled], pruned[1]['delta2'][settled])
    assert torch.equal(delta2[~settled], x.new_full((g, n), -7.0)[~settled])
    waiting = ~settled.gather(1, order)  # by density-order position
    assert torch.equal(count, waiting.sum(1).int())
    for w in range(g):
        want = waiting[w].nonzero().flatten().int()
        assert torch.equal(pending[w, :count[w]], want)
    torch.testing.assert_close(dmax2, pass1.rowmax.amax(1), rtol=0, atol=0)


@needs_triton
def test_pass1_knows_the_nearest_other_token():
    """With ``prune_denser`` pass 1 writes each row's nearest other token
    and its squared distance: the brute-force nearest, or -1 where that
    token shares the row's lane (column mod KNN_BLOCK_N; a lane keeps the
    column of its smallest key only, here the row itself) and for padding
    (no other token at a finite distance)."""
    from clustr_mm.ops.dpc_knn import fused
    x, counts, consts = windows((12, 14), 10, 2, 16, 2)  # 100-token windows
    g, n, c = x.shape
    config = fused.kernel_config(x.device, c, 'ieee', prune=True)
    with interpreted(fused):
        hi, lo, sq, tie = fused._prep(x, consts.invalid, 'ieee')
        pass1 = fused._knn_pass(hi, lo, sq, tie, consts.knn_scale, 5,
                                'ieee', config)
    y = x.double()
    d = y.pow(2).sum(-1)[:, :, None] + y.pow(2).sum(-1)[:, None, :] - (
        2 * y @ y.transpose(1, 2))
    pad = consts.invalid
    d = d.masked_fill(pad[:, None, :], float('inf'))
    d.diagonal(dim1=1, dim2=2).fill_(float('inf'))
    best_d, best = d.min(2)
    rows = torch.arange(n)
    lanes = fused.KNN_BLOCK_N
    shared = best % lanes == rows % lanes
    want = torch.where(shared | pad, -1, best)
    assert 0 < int((shared & ~pad).sum()) < g * n // 10  # both cases seen
    assert torch.equal(pass1.nearest.long(), want)
    known = want >= 0
    torch.testing.assert_close(pass1.nearest_d2[known].double(),
                               best_d[known], rtol=1e-5, atol=1e-5)

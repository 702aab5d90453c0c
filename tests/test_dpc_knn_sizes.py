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

from clustr_mm.registry import switch

from fused_cases import (EXACT_224, WINDOW_800, fused_agreement, interpreted,
                         needs_triton, windows)

BIG = pytest.mark.skipif(
    not switch('CLUSTR_MM_INTERPRET_BIG', False),
    reason='opt in with CLUSTR_MM_INTERPRET_BIG=1: the interpreter takes '
    '~20 s per 3,136-token window on 2 cores, 48 windows here (the CUDA tier '
    'runs it)')


def run_interpreted(name, hw, window_size, sr_ratio, channels, batch):
    """The agreement report of the fused kernels (interpreted) with the
    reference on one case; printed with its time."""
    from clustr_mm.ops.dpc_knn import fused
    x, counts, consts = windows(hw, window_size, sr_ratio, channels, batch)
    start = time.perf_counter()
    with interpreted(fused):
        report = fused_agreement(x, counts, consts)
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


@needs_triton
def test_small_windows_interpreted():
    """The fast loop's interpreter case: border windows padded, two row
    blocks (the merge kernel), k > tokens of the smallest window."""
    check(run_interpreted('fast-12x14-w10', (12, 14), 10, 2, 16, 1))


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize('size,batch', [('196x256', 2), ('784x128', 1)])
def test_exact_224_stages_interpreted(size, batch):
    hw, channels, sr = EXACT_224[size]
    check(run_interpreted(f'exact-224-{size}-b{batch}', hw, None, sr,
                          channels, batch))


@pytest.mark.slow
@needs_triton
def test_window_mode_border_windows_interpreted():
    """Window mode at 800 x 1344's stage-1 geometry (full windows, a
    bottom row of border windows padded, batch 2) at a quarter of the
    window side: 14-token windows over 22 x 28 tokens."""
    check(run_interpreted('window-22x28-w14-b2', (22, 28), 14, 8, 64, 2))


@pytest.mark.slow
@needs_triton
def test_exact_224_stage1_interpreted():
    hw, channels, sr = EXACT_224['3136x64']
    check(run_interpreted('exact-224-3136x64-b1', hw, None, sr, channels, 1))


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

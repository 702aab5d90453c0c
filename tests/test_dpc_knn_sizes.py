"""The fused DPC-kNN kernels, run by Triton's interpreter, against the
reference on random-normal fp32 tokens at the sizes ClusTR-S clusters.

Values are compared within the round-off bound derived in
:mod:`clustr_mm.models.layers.dpc_knn.agreement` (k nearest distances,
densities, distance to the nearest denser token), and ids are equal except
where the reference itself has a near-tie within that bound (counted and
printed as ``[agreement]`` lines). The interpreter runs in this process
(``fused_cases.interpreted``).

Interpreter time on the 2-core development CPU (torch 2.14.1, triton 3.8):
one 3,136-token window takes ~5 min, so ClusTR-S's stage 1 at 224 and the
48 windows of window mode at 800 x 1344 (batch 2) are opt in here
(``CLUSTR_MM_INTERPRET_BIG=1``) and run in the CUDA tier
(``test_cuda.py``); the slow tier has stages 2 and 3 at 224 and window mode
with the same geometry at a quarter of the window side.
"""
import json
import os
import time

import pytest

from fused_cases import (EXACT_224, WINDOW_800, fused_agreement, interpreted,
                         needs_triton, windows)

BIG = pytest.mark.skipif(
    os.environ.get('CLUSTR_MM_INTERPRET_BIG') != '1',
    reason='opt in with CLUSTR_MM_INTERPRET_BIG=1: the interpreter takes '
    '~5 min per 3,136-token window on 2 cores (the CUDA tier runs it)')


def run_interpreted(name, hw, window_size, sr_ratio, channels, batch):
    """The agreement report of the fused kernels (interpreted) with the
    reference on one case; printed with its time."""
    from clustr_mm.models.layers.dpc_knn import fused
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
    # the bound is a worst case; actual round-off is far below it
    assert max(report['knn'], report['rho'], report['delta2']) < 0.5, report
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


@BIG
@needs_triton
def test_exact_224_stage1_interpreted():
    hw, channels, sr = EXACT_224['3136x64']
    check(run_interpreted('exact-224-3136x64-b1', hw, None, sr, channels, 1))


@BIG
@needs_triton
def test_window_800x1344_stage1_interpreted():
    hw, ws, channels, sr = WINDOW_800
    check(run_interpreted('window-800x1344-s1-b2', hw, ws, sr, channels, 2))

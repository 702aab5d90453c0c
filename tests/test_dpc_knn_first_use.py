"""The fused op's first-use check, on the CPU: the kernels run under Triton's
interpreter in this process, through the real dispatch
(``assign_clusters`` with the fused plan); a patched kernel makes them
wrong. Also the comparison itself (``dpc_knn.agreement``)."""
import warnings

import pytest
import torch
from fused_cases import interpreted, needs_triton, windows

import clustr_mm  # noqa: F401
from clustr_mm.ops.dpc_knn import (FUSED_PLAN, WindowLayout, assign_clusters,
                                   first_use, fused)
from clustr_mm.ops.dpc_knn.agreement import compare, row_tolerance
from clustr_mm.ops.dpc_knn.blocked import dpc_knn_blocked
from clustr_mm.ops.dpc_knn.reference import augment, dpc_knn_reference

# 9 x 12 tokens in 8-token windows: 4 windows, 3 of them padded borders
HW, WS, SR, C = (9, 12), 8, 2, 16


@pytest.fixture
def kernels(monkeypatch):
    """The fused op runs its kernels on CPU tensors (interpreted), with a
    fresh first-use state; yields a list counting kernel launches."""
    monkeypatch.setattr(fused, 'INTERPRET', True)
    monkeypatch.delenv(first_use.OFF_ENV, raising=False)
    monkeypatch.delenv(first_use.STRICT_ENV, raising=False)
    first_use.reset()
    launches = []
    passes = fused._knn_pass
    monkeypatch.setattr(fused, '_knn_pass',
                        lambda *a: launches.append(1) or passes(*a))
    with interpreted(fused):
        yield launches
    first_use.reset()


# the interpreter wants triton.language among a kernel's globals
tl = fused.tl
_WRONG = {}


def _scaled_tile(*args):
    """The kernels' distances, ``_WRONG['factor']`` times too large
    (interpreted; the interpreter recompiles a kernel from its source in
    its module's globals, so no closure)."""
    return _WRONG['tile'](*args) * _WRONG['factor']


def wrong_distances(monkeypatch, factor=1.01):
    """Patch the kernels (under the interpreter) so that every distance
    they compute is ``factor`` times too large."""
    from triton.runtime.interpreter import InterpretedFunction
    monkeypatch.setitem(_WRONG, 'tile', fused._distances)
    monkeypatch.setitem(_WRONG, 'factor', factor)
    monkeypatch.setattr(fused, '_distances',
                        InterpretedFunction(_scaled_tile))


def tokens(seed=0):
    return torch.randn(1, HW[0] * HW[1], C,
                       generator=torch.Generator().manual_seed(seed))


def assign(x):
    layout = WindowLayout(HW, WS, SR, plan=FUSED_PLAN)
    return assign_clusters(x, layout).scales


def blocked_assign(x):
    plan = FUSED_PLAN._replace(kernel='blocked')
    return assign_clusters(x, WindowLayout(HW, WS, SR, plan=plan)).scales


@needs_triton
def test_first_use_passes_and_keeps_the_fused_op(kernels):
    x = tokens()
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        ids = assign(x)
    reports = first_use.check_reports()
    assert len(reports) == 1
    (key, report), = reports.items()
    assert key == ('fused', 'cpu', 'ieee', WS * WS, C, True)
    print(f'[first-use] {report}')
    # round-off far inside the worst-case bound (this case: 0.0130 of it
    # measured, 2026-11-27; ~3x that)
    assert report['agree'] and report['knn'] < 0.04, report
    # first use: the probed kernels and the op; then the op alone, no
    # second check
    assert len(kernels) == 2
    for a, b in zip(ids, blocked_assign(x)):
        assert torch.equal(a, b)
    assign(tokens(1))
    assert len(kernels) == 3 and len(first_use.check_reports()) == 1


@needs_triton
def test_wrong_kernel_falls_back_to_blocked_with_a_warning(kernels,
                                                           monkeypatch):
    wrong_distances(monkeypatch)
    x = tokens()
    with pytest.warns(RuntimeWarning) as caught:
        ids = assign(x)
    message = str(caught[0].message)
    report, = first_use.check_reports().values()
    assert not report['agree'] and report['knn'] > 10, report
    assert f"knn {report['knn']:.3g}x its bound" in message
    for part in ('Triton interpreter', f'torch {torch.__version__}',
                 'triton 3.', "issue tracker", first_use.OFF_ENV,
                 'blocked path instead of the fused one on cpu for the rest '
                 'of this process'):
        assert part in message, (part, message)
    for a, b in zip(ids, blocked_assign(x)):
        assert torch.equal(a, b)
    # the rest of the process: blocked, no kernels, no second warning
    launches = len(kernels)
    x2 = tokens(1)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        ids2 = assign(x2)
    assert len(kernels) == launches
    for a, b in zip(ids2, blocked_assign(x2)):
        assert torch.equal(a, b)


@needs_triton
def test_strict_makes_a_disagreement_an_error(kernels, monkeypatch):
    wrong_distances(monkeypatch)
    monkeypatch.setenv(first_use.STRICT_ENV, '1')
    with pytest.raises(first_use.FusedCheckError,
                       match=r'disagree with the blocked path .* knn '):
        assign(tokens())


@needs_triton
def test_switched_off_runs_the_op_unchecked(kernels, monkeypatch):
    wrong_distances(monkeypatch, factor=1.5)
    monkeypatch.setenv(first_use.OFF_ENV, '0')
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        ids = assign(tokens())
    assert not first_use.check_reports() and len(kernels) == 1
    # the (wrong) kernels' ids, not the blocked path's
    ref = blocked_assign(tokens())
    assert not all(torch.equal(a, b) for a, b in zip(ids, ref))


# --------------------------------------------------------------------------
# The comparison (no kernels).
def _probes(x, counts, consts):
    ref, got = {}, {}
    ref_ids = dpc_knn_reference(x, counts, 5, consts, probe=ref)
    got_ids = dpc_knn_blocked(x, counts, 5, consts, 1 << 12, True, got)
    return ref, got, ref_ids, got_ids


def test_blocked_path_agrees_with_reference_within_the_bound():
    x, counts, consts = windows((22, 28), 14, 8, 64, 2)
    ref, got, ref_ids, got_ids = _probes(x, counts, consts)
    report = compare(x, counts, consts, ref, got, ref_ids, got_ids)
    assert report['agree'], report
    assert report['unexplained_ids'] == report['center_mismatches'] == 0


@pytest.mark.parametrize('what', ['knn', 'rho', 'delta2', 'ids'])
def test_comparison_catches_a_wrong_value(what):
    x, counts, consts = windows((22, 28), 14, 8, 64, 2, seed=3)
    ref, got, ref_ids, got_ids = _probes(x, counts, consts)
    if what == 'ids':  # two clusters' ids swapped in one window
        ids = got_ids[0, 0]
        a, b = ids == 0, ids == 1
        got_ids = got_ids.clone()
        got_ids[0, 0][a], got_ids[0, 0][b] = 1, 0
    else:  # 0.1% off at one token
        got[what][1, 17] *= 1.001
    report = compare(x, counts, consts, ref, got, ref_ids, got_ids)
    assert not report['agree'], report
    if what == 'ids':
        assert report['unexplained_ids'] > 0, report
    else:
        assert report[what] > 1, report


def test_distance_bound_covers_fp32_round_off():
    """The per-row bound against the real error of the reference's fp32
    distances (fp64 truth), on tokens of very different norms: each fp32
    evaluation errs by at most half the bound (two evaluations share it),
    and the bound is not vacuous (within 1e5 of the actual error)."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 300, 64, generator=gen)
         * torch.logspace(-2, 2, 300)[:, None])
    rows, cols, _ = augment(x)
    d32 = torch.bmm(rows, cols).double()
    xd = x.double()
    sq = xd.pow(2).sum(-1)
    exact = sq[:, :, None] + sq[:, None, :] - 2 * xd @ xd.transpose(1, 2)
    err = (d32 - exact).abs().amax(-1)
    tol = row_tolerance(x, None).double()
    assert (err <= tol / 2).all()
    assert (tol / err.clamp_min(1e-30)).min() < 1e5


@pytest.mark.parametrize('variable', [first_use.OFF_ENV,
                                      first_use.STRICT_ENV])
def test_switch_values_are_parsed_alike_and_unknown_ones_refused(
        monkeypatch, variable):
    """Both switches take the same values; a misspelt one
    (``=disable``) is refused by name instead of leaving the check on."""
    read = (first_use._enabled if variable == first_use.OFF_ENV else
            first_use._strict)
    for value, expected in [('1', True), ('ON', True), ('yes', True),
                            ('0', False), ('off', False), ('False', False)]:
        monkeypatch.setenv(variable, value)
        assert read() is expected, value
    monkeypatch.setenv(variable, '')
    assert read() is (variable == first_use.OFF_ENV)  # the default
    monkeypatch.setenv(variable, 'disable')
    with pytest.raises(ValueError, match=rf"{variable}='disable' is not a "
                       r"switch value: use one of \('1', 'on'"):
        read()

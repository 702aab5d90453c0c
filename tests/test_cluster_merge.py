"""ClusTR's clustering and merge as one op (``clustr_mm::dpc_knn_merge``,
the fused plan's path) against the same code as plain torch calls: the same
ids and cluster tokens, gradients of the op's written-out backward equal to
autograd's, shapes of its fake implementation equal to a real call's."""
import pytest
import torch

from clustr_mm.ops.dpc_knn import FUSED_PLAN, WindowLayout
from clustr_mm.ops.dpc_knn import merge as merge_mod
from clustr_mm.ops.dpc_knn.merge import (cluster_and_merge, layout_for,
                                         merge_shape, split_scales)

needs_custom_op = pytest.mark.skipif(
    not merge_mod.HAS_CUSTOM_OP,
    reason='the op needs torch.library.custom_op (torch >= 2.4)')

# (grid, window size, sr_ratio, batch, channels): exact mode with both scales
# clustered; exact with the fine scale the identity (14 x 14, sr 2: 49 and
# 196 clusters); windows with padded border windows; a border window short
# of k tokens.
CASES = [((9, 11), None, 2, 2, 6), ((14, 14), None, 2, 2, 8),
         ((11, 13), 5, 2, 3, 4), ((10, 16), 8, 4, 2, 5)]


def _inputs(b, n, c, seed=0):
    g = torch.Generator().manual_seed(seed)
    # values in {-1, 0, 1}: duplicate tokens, exact distance sums
    x = torch.randint(-1, 2, (b, n, c), generator=g).float()
    logits = torch.randn(b, n, 1, generator=g)
    return x, logits


def _plain(x, w, layout, log_weights):
    """The body as torch calls, autograd through them."""
    ids, _, merged = merge_mod._body(x, w, layout, log_weights)
    return ids, merged


@needs_custom_op
@pytest.mark.parametrize('case', CASES, ids=lambda c: f'{c[0]}-{c[1]}')
@pytest.mark.parametrize('weights', ['log', 'plain', 'none'])
def test_op_equals_torch_calls_with_gradients(case, weights):
    hw, ws, sr, b, c = case
    layout = layout_for(hw, ws, sr, (1, 4), 5, torch.device('cpu'),
                        FUSED_PLAN)
    x, logits = _inputs(b, hw[0] * hw[1], c)
    w = {'log': logits, 'plain': logits.exp(), 'none': None}[weights]
    log = weights == 'log'
    results = []
    for run in (cluster_and_merge, _plain):
        xr = x.clone().requires_grad_()
        wr = None if w is None else w.clone().requires_grad_()
        ids, merged = run(xr, wr, layout, log)
        # a loss that weighs every row and channel differently
        probe = torch.linspace(-1, 2, merged.numel()).view_as(merged)
        (merged * probe).sum().backward()
        results.append((ids, merged, xr.grad,
                        None if wr is None else wr.grad))
    (ids_op, merged_op, gx_op, gw_op), (ids, merged, gx, gw) = results
    assert all(torch.equal(a, e) for a, e in zip(ids_op.scales, ids.scales))
    assert torch.equal(merged_op, merged)
    # the written-out backward sums in another order than autograd's:
    # measured (fp32, these cases) x's gradients equal, the weights' within
    # 6.4e-6 of their largest magnitude (x . g - m . g cancels)
    torch.testing.assert_close(gx_op, gx, rtol=1e-6, atol=1e-6)
    if w is not None:
        bound = 2e-5 * float(gw.abs().max())
        torch.testing.assert_close(gw_op, gw, rtol=0, atol=bound)
    rows = merge_shape(hw, ws, sr, (1, 4), b)[2]
    assert merged.shape == (rows, c)


@needs_custom_op
def test_merged_rows_are_weighted_means():
    """Each cluster token is sum(w x) / (sum(w) + 1e-6) of its members, per
    scale, an identity scale's tokens scaled by w / (w + 1e-6)."""
    hw, b, c = (14, 14), 2, 3
    layout = layout_for(hw, None, 2, (1, 4), 5, torch.device('cpu'),
                        FUSED_PLAN)
    x, logits = _inputs(b, hw[0] * hw[1], c, seed=3)
    ids, merged = cluster_and_merge(x, logits, layout, True)
    coarse, fine = split_scales(merged, layout, b)
    assert layout.identity == [False, True]
    w = logits.exp()
    assert coarse.shape == (b, 49, c) and fine.shape == (b, 196, c)
    for i in range(b):
        for m in range(49):
            member = ids.scales[0][i] == m
            expected = (x[i][member] * w[i][member]).sum(0) / (
                w[i][member].sum() + 1e-6)
            torch.testing.assert_close(coarse[i, m], expected)
    torch.testing.assert_close(fine, x * w / (w + 1e-6))


@needs_custom_op
@pytest.mark.parametrize('case', CASES, ids=lambda c: f'{c[0]}-{c[1]}')
def test_fake_implementation_has_the_real_shapes(case):
    from torch._subclasses.fake_tensor import FakeTensorMode
    hw, ws, sr, b, c = case
    layout = layout_for(hw, ws, sr, (1, 4), 5, torch.device('cpu'),
                        FUSED_PLAN)
    x, logits = _inputs(b, hw[0] * hw[1], c)
    args = (list(hw), ws or 0, sr, [1, 4], 5,
            *merge_mod._plan_args(FUSED_PLAN), True)
    real = torch.ops.clustr_mm.dpc_knn_merge(x, logits, *args)
    with FakeTensorMode() as mode:
        fake = torch.ops.clustr_mm.dpc_knn_merge(
            mode.from_tensor(x), mode.from_tensor(logits), *args)
    assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype)
                                                   for t in real]
    assert len(layout.clustered) == real[0].shape[0]


def test_layouts_are_shared_and_remember_their_sizes():
    a = layout_for((9, 11), 5, 2, (1, 4), 5, torch.device('cpu'), FUSED_PLAN)
    b = layout_for((9, 11), 5, 2, (1, 4), 5, torch.device('cpu'), FUSED_PLAN)
    assert a is b
    assert (a.window_size, a.sr_ratio, a.scale_factors) == (5, 2, (1, 4))
    assert isinstance(a, WindowLayout)


@pytest.fixture
def merge_kernels_on_cpu(monkeypatch):
    """The merge as where the kernels run, with ``kernels`` standing in
    for them (no Triton needed), and the first-use checks forgotten."""
    from clustr_mm.ops.dpc_knn import first_use
    first_use.reset()
    calls = []

    def use(kernels):
        def counted(*args):
            calls.append(1)
            return kernels(*args)
        monkeypatch.setattr(merge_mod, 'runs_kernels', lambda x: True)
        monkeypatch.setattr(merge_mod, 'merge_kernels', counted)
        return calls
    yield use
    first_use.reset()


def _layout():
    return layout_for((9, 11), None, 2, (1, 4), 5, torch.device('cpu'),
                      FUSED_PLAN)


def _bodies(n=2):
    x, logits = _inputs(2, 99, 6)
    return [merge_mod._body(x, logits, _layout(), True) for _ in range(n)]


def test_merge_kernels_that_agree_are_checked_once(merge_kernels_on_cpu,
                                                   recwarn):
    calls = merge_kernels_on_cpu(merge_mod.merge_torch)
    first, second = _bodies()
    assert len(calls) == 2  # checked on the first call, trusted after
    assert torch.equal(first[2], second[2])
    assert not [w for w in recwarn if 'merge kernels' in str(w.message)]


def test_merge_kernels_that_disagree_fall_back_to_torch(
        merge_kernels_on_cpu, monkeypatch):
    def wrong(*args):
        rows, merged = merge_mod.merge_torch(*args)
        return rows, merged + 1e-3
    calls = merge_kernels_on_cpu(wrong)
    with pytest.warns(RuntimeWarning, match='the merge kernels disagree '
                      r'with torch .*cluster tokens differ by up to 0.001'):
        first, second = _bodies()
    assert len(calls) == 1  # not again on that device
    # both calls give the torch merge's tokens
    monkeypatch.setattr(merge_mod, 'runs_kernels', lambda x: False)
    (reference, ) = _bodies(1)
    assert torch.equal(first[2], reference[2])
    assert torch.equal(second[2], reference[2])


def test_merge_check_is_strict_on_request(merge_kernels_on_cpu,
                                          monkeypatch):
    from clustr_mm.ops.dpc_knn.first_use import FusedCheckError
    merge_kernels_on_cpu(lambda *args: (args[3].flatten(1)[:1] * 0,
                                        merge_mod.merge_torch(*args)[1]))
    monkeypatch.setenv('CLUSTR_MM_FUSED_CHECK_STRICT', '1')
    with pytest.raises(FusedCheckError, match='token rows differ'):
        _bodies(1)


@needs_custom_op
def test_flop_counter_counts_the_clustering_inside_the_op():
    """The op's FLOPs (torch.utils.flop_counter, the traffic census): the
    fused DPC-kNN's on the padded windows plus the merge's sums."""
    from torch.utils.flop_counter import FlopCounterMode

    from clustr_mm.ops.dpc_knn.fused import dpc_knn_flops
    from clustr_mm.ops.dpc_knn.merge import dpc_knn_merge_flops
    x, logits = _inputs(2, 11 * 13, 4)
    layout = layout_for((11, 13), 5, 2, (1, 4), 5, torch.device('cpu'),
                        FUSED_PLAN)
    with FlopCounterMode(display=False) as counter:
        cluster_and_merge(x, logits, layout, True)
    flops = counter.get_total_flops()
    # 3 x 3 windows of 5 x 5 tokens padded, per image; at most 24 centers
    assert flops == dpc_knn_merge_flops((2, 143, 4), (11, 13), 5, 2, (1, 4))
    assert flops == dpc_knn_flops(18, 25, 4, 24) + 2 * 2 * 143 * 4 * 2

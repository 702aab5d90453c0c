"""The DPC-kNN dispatch: one place picks the backend and says why it did not
take the others; every backend has the same interface and the same ids."""
import inspect
import logging

import pytest
import torch

import clustr_mm  # noqa: F401
from clustr_mm.models.layers.dpc_knn import DPCKNN
from clustr_mm.ops.dpc_knn import (ACCELERATOR_PLAN, CPU_PLAN, FUSED_PLAN,
                                   TRACE_PLAN, Task, WindowLayout,
                                   assign_clusters, batch_consts, blocked,
                                   choose_backend, default_plan, dispatch,
                                   first_use, fused)

pytestmark = pytest.mark.torch21

CPU = torch.device('cpu')
ON_CPU = Task(CPU)


def test_cpu_takes_blocked_and_says_why_not_fused(caplog):
    with caplog.at_level(logging.DEBUG, logger=dispatch.__name__):
        choice = choose_backend(ON_CPU)
    assert choice.backend == 'blocked' and choice.plan == CPU_PLAN
    assert choice.not_taken == (
        ('fused', 'tensors on cpu: the kernels run on CUDA'), )
    (line, ) = [r.getMessage() for r in caplog.records
                if r.name == dispatch.__name__]
    assert line == ('DPC-kNN on cpu (float32, k 5, 2 scales): blocked '
                    'backend; not fused: tensors on cpu: the kernels run on '
                    'CUDA')


@pytest.mark.skipif(torch.cuda.is_available(), reason='a CPU-only machine '
                    'tells why CUDA tensors cannot take the fused kernels')
def test_cuda_without_a_gpu_takes_the_accelerator_plan():
    choice = choose_backend(Task(torch.device('cuda')))
    assert choice.backend == 'blocked' and choice.plan == ACCELERATOR_PLAN
    ((name, reason), ) = choice.not_taken
    assert name == 'fused'
    assert reason in ('triton is not installed', 'CUDA is not available',
                      'torch.library.custom_op is missing (torch < 2.4)')


def test_a_jit_trace_records_the_reference():
    seen = []

    def traced(x):
        seen.append(choose_backend(ON_CPU))
        return x * 2

    torch.jit.trace(traced, torch.ones(2), check_trace=False)
    (choice, ) = seen
    assert choice.backend == 'reference' and choice.plan == TRACE_PLAN
    assert [n for n, _ in choice.not_taken] == ['fused', 'blocked']
    assert all('torch.jit.trace' in r for _, r in choice.not_taken)


def test_a_plan_names_its_backend():
    choice = choose_backend(ON_CPU, FUSED_PLAN)
    assert choice == (('fused', FUSED_PLAN, ()))
    choice = choose_backend(ON_CPU, TRACE_PLAN)
    assert choice.backend == 'reference' and choice.plan is TRACE_PLAN
    assert choice.not_taken == (('fused', "the plan names 'reference'"),
                                ('blocked', "the plan names 'reference'"))
    with pytest.raises(ValueError, match=r"plan.kernel must be one of "
                       r"\['fused', 'blocked', 'reference'\], got 'cuda'"):
        choose_backend(ON_CPU, CPU_PLAN._replace(kernel='cuda'))


def test_default_plans_and_an_unknown_kernel():
    cuda = torch.device('cuda')
    assert default_plan('fused', cuda) is FUSED_PLAN
    assert default_plan('blocked', CPU) is CPU_PLAN
    assert default_plan('blocked', None) is CPU_PLAN
    assert default_plan('blocked', cuda) is ACCELERATOR_PLAN
    assert default_plan('reference', cuda) is TRACE_PLAN
    with pytest.raises(ValueError, match=r"kernel must be one of \['fused', "
                       r"'blocked', 'reference'\], got 'cuda'"):
        default_plan('cuda', cuda)


def test_batch_constants_made_once_per_batch_size_and_given_to_the_merge():
    layout = WindowLayout((11, 13), 5, 2, plan=CPU_PLAN)
    x = torch.randn(2, 11 * 13, 6)
    ids = assign_clusters(x, layout)
    assert ids.consts is batch_consts(layout, 2, 6)  # kept, not remade
    assert set(layout.batches) == {(2, 6)}
    assert assign_clusters(x[:1], layout).consts is not ids.consts
    assert set(layout.batches) == {(2, 6), (1, 6)}


def test_reducer_reports_its_choice_with_its_settings():
    reducer = DPCKNN(2, max_chunk_elems=1000)
    choice = reducer.backend(CPU)
    assert choice.backend == 'blocked'
    # the reducer's precision (default 'tf32x3') is in whatever plan runs
    assert choice.plan == CPU_PLAN._replace(max_chunk_elems=1000,
                                            precision='tf32x3')
    layout = reducer.layout((6, 6), CPU)
    assert layout.plan == choice.plan
    reducer = DPCKNN(2, plan=FUSED_PLAN._replace(precision='tf32x3'),
                     precision='tf32x3')
    assert reducer.backend(CPU) == ('fused', FUSED_PLAN._replace(
        precision='tf32x3'), ())


def test_backends_share_one_interface_and_give_the_same_ids():
    names = [b.NAME for b in dispatch.BACKENDS]
    assert names == ['fused', 'blocked', 'reference']  # fastest first
    signatures = {str(inspect.signature(b.run)) for b in dispatch.BACKENDS}
    assert len(signatures) == 1, signatures
    for b in dispatch.BACKENDS:
        assert inspect.signature(b.why_not).parameters.keys() == {'task'}
        assert default_plan(b.NAME, CPU).kernel == b.NAME
    torch.manual_seed(0)
    x = torch.randn(2, 11 * 13, 6)
    ids = [assign_clusters(x, WindowLayout((11, 13), 5, 2, plan=default_plan(
        b.NAME, CPU)._replace(max_chunk_elems=64))).scales
           for b in dispatch.BACKENDS]
    for other in ids[1:]:
        assert all(torch.equal(a, b) for a, b in zip(ids[0], other))


@pytest.mark.skipif(not fused.HAS_CUSTOM_OP or fused.triton is None,
                    reason='the fused op needs torch >= 2.4 and triton')
def test_fused_why_not_covers_device_dtype_and_sizes(monkeypatch):
    """On CUDA (pretended here), the fused backend declines what its
    kernels cannot hold, and the dispatch takes the blocked one instead of
    failing inside the op: another dtype, k above fused.MAX_K, more scales
    than fused.MAX_SCALES."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    cuda = torch.device('cuda')
    assert fused.why_not(Task(cuda)) is None
    assert fused.why_not(Task(cuda, torch.float16)) == (
        'tokens of torch.float16: the kernels read float32 tokens')
    assert fused.why_not(Task(cuda, k=fused.MAX_K + 1)) == (
        f'k = {fused.MAX_K + 1}: the kernels keep at most {fused.MAX_K} '
        'neighbours')
    assert fused.why_not(Task(cuda, scales=3)) == (
        '3 scales: the kernels assign at most 2')
    assert DPCKNN(2).backend(cuda).backend == 'fused'
    choice = DPCKNN(2, k=9).backend(cuda)
    assert choice.backend == 'blocked' and choice.plan.kernel == 'blocked'
    assert choice.not_taken == (
        ('fused', 'k = 9: the kernels keep at most 8 neighbours'), )
    # the other backends take any dtype and size
    for task in (Task(cuda, torch.float16), Task(cuda, k=9),
                 Task(cuda, scales=3)):
        assert blocked.why_not(task) is None


def test_the_first_use_check_wraps_any_backend_by_its_interface(
        monkeypatch):
    """first_use.Checked needs only the public interface of the backend it
    checks (run, runs_kernels, probed): here a backend made in this test,
    whose ids are the blocked backend's with two clusters swapped, is
    caught on its first use and replaced by the oracle."""

    class Swapped:
        NAME, HOLDS_BLOCKS = 'swapped', False
        calls = []

        def why_not(self, task):
            return None

        def runs_kernels(self, x):
            return True

        def run(self, x, counts, k, windows, plan):
            self.calls.append('run')
            return self.probed(x, counts, k, windows, plan)[0]

        def probed(self, x, counts, k, windows, plan):
            ids, values = blocked.probed(x, counts, k, windows, plan)
            return (ids + 1) % counts[0], values  # every id moved

    monkeypatch.setattr(first_use, '_reports', {})
    monkeypatch.setattr(first_use, '_fallen_back', {})
    checked = first_use.Checked(Swapped(), blocked)
    assert checked.NAME == 'swapped' and checked.why_not(ON_CPU) is None
    layout = WindowLayout((8, 8), None, 4, plan=CPU_PLAN)  # 4 and 16
    windows = batch_consts(layout, 1, 8).groups[0].windows
    win, counts = torch.randn(1, 64, 8), [4, 16]
    with pytest.warns(RuntimeWarning, match='the swapped DPC-kNN kernels '
                      'disagree with the blocked path'):
        ids = checked.run(win, counts, 5, windows, CPU_PLAN)
    want = blocked.run(win, counts, 5, windows, CPU_PLAN)
    assert torch.equal(ids, want)
    assert checked.run(win, counts, 5, windows, CPU_PLAN).equal(want)
    assert Swapped.calls == []  # after the failed check: the oracle only

    # Another fast backend on the same device and windows has a check and a
    # fallback of its own: the swapped one's failure does not replace it.
    class Honest(Swapped):
        NAME = 'honest'
        calls = []

        def probed(self, x, counts, k, windows, plan):
            return blocked.probed(x, counts, k, windows, plan)

    honest = first_use.Checked(Honest(), blocked)
    assert honest.run(win, counts, 5, windows, CPU_PLAN).equal(want)
    assert honest.run(win, counts, 5, windows, CPU_PLAN).equal(want)
    assert Honest.calls == ['run', 'run']
    reports = first_use.check_reports()
    assert {(key.backend, report['agree'])
            for key, report in reports.items()} == {('swapped', False),
                                                    ('honest', True)}

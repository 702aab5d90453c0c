"""The DPC-kNN dispatch: one place picks the backend and says why it did not
take the others; every backend has the same interface and the same ids."""
import inspect
import logging

import pytest
import torch

import clustr_mm  # noqa: F401
from clustr_mm.models.layers.dpc_knn import (ACCELERATOR_PLAN, CPU_PLAN,
                                             DPCKNN, FUSED_PLAN, TRACE_PLAN,
                                             WindowLayout, assign_clusters,
                                             batch_consts, choose_backend,
                                             default_plan, dispatch)

pytestmark = pytest.mark.torch21

CPU = torch.device('cpu')


def test_cpu_takes_blocked_and_says_why_not_fused(caplog):
    with caplog.at_level(logging.DEBUG, logger=dispatch.__name__):
        choice = choose_backend(CPU)
    assert choice.backend == 'blocked' and choice.plan == CPU_PLAN
    assert choice.not_taken == (
        ('fused', 'tensors on cpu: the kernels run on CUDA'), )
    (line, ) = [r.getMessage() for r in caplog.records
                if r.name == dispatch.__name__]
    assert line == ('DPC-kNN on cpu: blocked backend; not fused: tensors on '
                    'cpu: the kernels run on CUDA')


@pytest.mark.skipif(torch.cuda.is_available(), reason='a CPU-only machine '
                    'tells why CUDA tensors cannot take the fused kernels')
def test_cuda_without_a_gpu_takes_the_accelerator_plan():
    choice = choose_backend(torch.device('cuda'))
    assert choice.backend == 'blocked' and choice.plan == ACCELERATOR_PLAN
    ((name, reason), ) = choice.not_taken
    assert name == 'fused'
    assert reason in ('triton is not installed', 'CUDA is not available',
                      'torch.library.custom_op is missing (torch < 2.4)')


def test_a_jit_trace_records_the_reference():
    seen = []

    def traced(x):
        seen.append(choose_backend(CPU))
        return x * 2

    torch.jit.trace(traced, torch.ones(2), check_trace=False)
    (choice, ) = seen
    assert choice.backend == 'reference' and choice.plan == TRACE_PLAN
    assert [n for n, _ in choice.not_taken] == ['fused', 'blocked']
    assert all('torch.jit.trace' in r for _, r in choice.not_taken)


def test_a_plan_names_its_backend():
    choice = choose_backend(CPU, FUSED_PLAN)
    assert choice == (('fused', FUSED_PLAN, ()))
    choice = choose_backend(CPU, TRACE_PLAN)
    assert choice.backend == 'reference' and choice.plan is TRACE_PLAN
    assert choice.not_taken == (('fused', "the plan names 'reference'"),
                                ('blocked', "the plan names 'reference'"))
    with pytest.raises(ValueError, match=r"plan.kernel must be one of "
                       r"\['fused', 'blocked', 'reference'\], got 'cuda'"):
        choose_backend(CPU, CPU_PLAN._replace(kernel='cuda'))


def test_default_plans_and_an_unknown_kernel():
    cuda = torch.device('cuda')
    assert default_plan('fused', cuda) is FUSED_PLAN
    assert default_plan('blocked', CPU) is CPU_PLAN
    assert default_plan('blocked', None) is CPU_PLAN
    assert default_plan('blocked', cuda) is ACCELERATOR_PLAN
    assert default_plan('reference', cuda) is TRACE_PLAN
    with pytest.raises(ValueError, match="kernel must be 'fused', 'blocked' "
                       "or 'reference', got 'cuda'"):
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
        assert inspect.signature(b.why_not).parameters.keys() == {'device'}
        assert default_plan(b.NAME, CPU).kernel == b.NAME
    torch.manual_seed(0)
    x = torch.randn(2, 11 * 13, 6)
    ids = [assign_clusters(x, WindowLayout((11, 13), 5, 2, plan=default_plan(
        b.NAME, CPU)._replace(max_chunk_elems=64))).scales
           for b in dispatch.BACKENDS]
    for other in ids[1:]:
        assert all(torch.equal(a, b) for a, b in zip(ids[0], other))

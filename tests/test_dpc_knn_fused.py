"""The fused DPC-kNN (Triton kernels in one custom op) against the reference.

Without a GPU the kernels run under Triton's interpreter, which must be
switched on before they are defined: those cases run in one child process
(:func:`interpreted_cases`). Integer-valued features make every fp32 sum
exact, so cluster ids must be equal. The interpreter accepts kernels a GPU
compiler would reject, so the kernels are also compiled ahead of time for
sm_80 and sm_90 (Triton bundles ptxas).
"""
import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fused_cases import TORCH, TRITON, needs_triton, triton

HERE = Path(__file__).resolve().parent

# (grid, window size, sr_ratio, batch, channels): exact mode; windows with
# border windows at the bottom, at the right, both, none; border windows
# with fewer than k = 5 tokens (11 x 13 in 5-windows: 1 x 3 tokens).
CASES = [((7, 9), None, 2, 3, 8), ((9, 9), None, 2, 1, 4),
         ((11, 10), 5, 2, 3, 6), ((10, 13), 5, 2, 1, 6),
         ((11, 13), 5, 2, 3, 16), ((10, 15), 5, 2, 3, 6),
         ((16, 20), 8, 4, 2, 20)]
# Pass 1 alone, (tokens, windows, channels): one partial block, one whole
# block, two to four blocks of 64 with a partial last one.
# With 16, 32 or 64 channels pass 1 loads a row block's channels once.
PASS1_CASES = [(10, 2, 8), (64, 1, 4), (100, 3, 6), (150, 2, 5),
               (230, 2, 16), (130, 2, 32), (200, 1, 64)]


def pass1_matches_full_matrix(n, g, c):
    """Pass 1's outputs against the same quantities of the whole distance
    matrix, with padding and duplicate tokens: [knn, rowmax, first] equal."""
    from clustr_mm.ops.dpc_knn import fused
    from clustr_mm.ops.dpc_knn.reference import augment, first_duplicate
    x = torch.randint(-1, 2, (g, n, c)).float()
    invalid = torch.rand(g, n) < 0.2
    invalid[0, -1] = invalid[-1, 0] = True
    x[invalid] = 0
    _, _, tie = augment(x, None, invalid)
    k = min(5, n)
    hi, lo, sq, tie_k = fused._prep(x, invalid, 'ieee')
    pass1 = fused._knn_pass(hi, lo, sq, tie_k, None, k, 'ieee')
    knn, rowmax, first = pass1.knn, pass1.rowmax, pass1.first
    d = x.pow(2).sum(-1)[:, :, None] + x.pow(2).sum(-1)[:, None, :] - (
        2 * x @ x.transpose(1, 2))
    d = d.masked_fill(invalid[:, :, None] | invalid[:, None, :],
                      float('inf'))
    d.diagonal(dim1=1, dim2=2).zero_()
    near = d.topk(k, -1, largest=False).values
    return [torch.equal(tie_k, tie),
            torch.equal(knn, near.masked_fill(near <= tie[..., None], 0.0)),
            torch.equal(rowmax, d.nan_to_num(posinf=0.0).amax(-1)),
            torch.equal(first, first_duplicate(d, tie))]


def near_duplicates(b, n, c):
    """Integer tokens (so every product, also as 3xTF32, is exact) where
    some pairs are 1 apart (squared) at |a|^2 ~ 1e5: within the 'tf32x3'
    tie threshold of their tokens, outside the 'ieee' one (c = 8)."""
    x = torch.randint(100, 124, (b, n, c)).float()
    x[:, 1::3] = x[:, 0::3][:, :x[:, 1::3].shape[1]]
    x[:, 1::3, 0] += 1
    return x


def interpreted_cases():
    """Run in a child with ``TRITON_INTERPRET=1``; prints JSON results."""
    from clustr_mm.models.backbones.clustr import ClusTR
    from clustr_mm.models.layers.dpc_knn import use_plan
    from clustr_mm.ops.dpc_knn import (FUSED_PLAN, TRACE_PLAN, WindowLayout,
                                       assign_clusters, fused)
    assert fused.INTERPRET
    # before the spies below wrap the passes (they dispatch ops of their own)
    launches = {f'{c}-{precision}': clustering_launches(c, precision)
                for c, precision in ((64, 'tf32x3'), (8, 'ieee'))}
    calls, seen = [], []
    passes, knn_pass = fused._triton_passes, fused._knn_pass

    def counted(*args):
        calls.append(1)
        return passes(*args)

    def knn_seen(hi, lo, sq, tie, knn_scale, k, precision, config=None):
        # the precision the kernels get, and the tie threshold per |x|^2
        real = (sq > 0) & (sq < float('inf'))
        seen.append((precision, float((tie / sq)[real].amax()),
                     hi.shape[-1]))
        return knn_pass(hi, lo, sq, tie, knn_scale, k, precision, config)

    fused._triton_passes, fused._knn_pass = counted, knn_seen
    out = dict(ids={}, model={})
    torch.manual_seed(0)
    for hw, ws, sr, b, c in CASES:
        # values in {-1, 0, 1}: many duplicate tokens, exact sums
        x = torch.randint(-1, 2, (b, hw[0] * hw[1], c)).float()
        ref = assign_clusters(x, WindowLayout(hw, ws, sr,
                                              plan=TRACE_PLAN)).scales
        got = assign_clusters(x, WindowLayout(hw, ws, sr,
                                              plan=FUSED_PLAN)).scales
        out['ids'][f'{hw}-{ws}-b{b}'] = all(
            torch.equal(r, g) for r, g in zip(ref, got))
    out['kernel_calls'] = len(calls)
    # 'tf32x3': integer tokens with and without near-duplicates, against
    # the reference with the same tie threshold (emulated 3xTF32: exact
    # here, as on a GPU)
    tf32x3 = FUSED_PLAN._replace(precision='tf32x3')
    out['tf32x3'] = {}
    for hw, ws, sr, b, c in CASES[:3]:
        for name, x in (('ints', torch.randint(-1, 2, (b, hw[0] * hw[1], c))
                         .float()),
                        ('near', near_duplicates(b, hw[0] * hw[1], 8))):
            seen.clear()
            ref = dpc_knn_assign_emulated(x, hw, ws, sr)
            got = assign_clusters(x, WindowLayout(hw, ws, sr,
                                                  plan=tf32x3)).scales
            out['tf32x3'][f'{name}-{hw}-{ws}-b{b}'] = dict(
                same=all(torch.equal(r, g) for r, g in zip(ref, got)),
                seen=seen[:1])
    out['pass1'] = {f'n{n}-g{g}-c{c}': pass1_matches_full_matrix(n, g, c)
                    for n, g, c in PASS1_CASES}
    for mode in ('exact', 'window'):
        torch.manual_seed(1)
        model = ClusTR('tiny', clustering_mode=mode, window_size=8,
                       out_indices=(2, )).eval()
        x = torch.randn(1, 3, 64, 80)
        with torch.no_grad():
            use_plan(model, TRACE_PLAN)
            ref = model(x)[0]
            use_plan(model, FUSED_PLAN)
            got = model(x)[0]
        out['model'][mode] = float((ref - got).abs().max())
    out['launches'] = launches
    out['merge'] = merge_cases()
    print('RESULT ' + json.dumps(out))


def launched(fn, modules):
    """The kernels (of ``modules``) and torch ops ``fn()`` launches under
    the interpreter, in order (allocations and views are no launches)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from clustr_mm.analysis.op_census import ALLOC_OPS, VIEW_OPS
    names, in_kernel = [], []

    class Launch:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def call(*args, **kwargs):
                names.append(self.name)
                in_kernel.append(1)  # the interpreter's own torch calls
                try:
                    return self.kernel[grid](*args, **kwargs)
                finally:
                    in_kernel.pop()
            return call

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            if not in_kernel and name not in VIEW_OPS | ALLOC_OPS:
                names.append(name)
            return func(*args, **(kwargs or {}))

    kernels = {(m, n): getattr(m, n) for m in modules for n in dir(m)
               if n.startswith('_') and n.endswith('_kernel')}
    try:
        for (m, n), kernel in kernels.items():
            setattr(m, n, Launch(n, kernel))
        with Ops():
            fn()
    finally:
        for (m, n), kernel in kernels.items():
            setattr(m, n, kernel)
    return names


def clustering_launches(c, precision):
    """(launched, listed): what one fused DPC-kNN call launches and what
    ``fused.gpu_launches`` (the op census's count of its CUDA path) lists
    for it."""
    from clustr_mm.ops.dpc_knn import fused
    from clustr_mm.ops.dpc_knn.common import Windows
    x = torch.randint(-1, 2, (3, 40, c)).float()
    names = launched(lambda: fused._triton_passes(
        x, [4, 12], 5, Windows(None, None, None), precision), [fused])
    return names, fused.gpu_launches(x, None, None, None, [4, 12], 5,
                                     precision)


def merge_cases():
    """The merge kernels against the torch merge: per case, rows equal,
    the largest |difference| of the cluster tokens (integer tokens and
    weights: exact sums; log-weights: exp and sums in another order), and
    what they launch."""
    from clustr_mm.ops.dpc_knn import (FUSED_PLAN, assign_clusters,
                                       batch_consts)
    from clustr_mm.ops.dpc_knn import merge
    out = {}
    torch.manual_seed(0)
    for hw, ws, sr, b, c in CASES[:3] + [((14, 14), None, 2, 2, 40)]:
        layout = merge.layout_for(hw, ws, sr, (1, 4), 5,
                                  torch.device('cpu'), FUSED_PLAN)
        n = hw[0] * hw[1]
        x = torch.randint(-1, 2, (b, n, c)).float()
        ids = assign_clusters(x, layout)
        consts = batch_consts(layout, b, c)
        rows = merge.token_rows(ids.clustered, consts)
        for name, w, log in (
                ('ints', torch.randint(1, 4, (b, n, 1)).float(), False),
                ('none', None, False), ('log', torch.randn(b, n, 1), True)):
            ref = merge.merge_sums(x, w, log, rows, consts.merge_zeros)
            got = []
            names = launched(lambda: got.extend(merge.merge_kernels(
                x, w, log, ids.clustered, consts)), [merge])
            out[f'{hw}-{ws}-{name}'] = dict(
                rows=torch.equal(got[0], rows),
                diff=float((got[1] - ref).abs().max()), launched=names,
                identity=consts.identity_rows is not None)
    return out


def dpc_knn_assign_emulated(x, hw, ws, sr):
    """Ids of the reference with emulated 3xTF32 distances."""
    from clustr_mm.ops.dpc_knn import reference as ref
    original = ref.dpc_knn_reference
    ref.dpc_knn_reference = (lambda *a: original(*a, emulate='tf32x3'))
    try:
        return dpc_knn_assign_ieee(x, hw, ws, sr)
    finally:
        ref.dpc_knn_reference = original


@pytest.fixture(scope='module')
def interpreted():
    env = dict(os.environ, TRITON_INTERPRET='1')
    code = ('import sys; sys.path.insert(0, sys.argv[1]); '
            'import test_dpc_knn_fused as t; t.interpreted_cases()')
    proc = subprocess.run([sys.executable, '-c', code, str(HERE)],
                          capture_output=True, text=True, env=env,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('RESULT ')]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1][7:])


@pytest.mark.slow
@needs_triton
def test_fused_ids_equal_reference(interpreted):
    assert len(interpreted['ids']) == len(CASES)
    assert interpreted['kernel_calls'] >= len(CASES)  # the kernels ran
    bad = [k for k, same in interpreted['ids'].items() if not same]
    assert not bad, bad


@pytest.mark.slow
@needs_triton
def test_census_lists_the_launches_the_kernels_make(interpreted):
    """What the op census counts for one fused op call (its CUDA path,
    which a CPU census cannot run) is what a run launches, in order: with
    pass 2 pruned (64 channels, 'tf32x3' on sm_90) and without."""
    from clustr_mm.ops.dpc_knn.merge import MERGE_LAUNCHES
    launches = interpreted['launches']
    assert '_pending_kernel' in launches['64-tf32x3'][0]
    assert '_pending_kernel' not in launches['8-ieee'][0]
    for key, (names, listed) in launches.items():
        assert names == listed, key
    for key, case in interpreted['merge'].items():
        assert case['launched'] == list(MERGE_LAUNCHES), key


@pytest.mark.slow
@needs_triton
def test_merge_kernels_equal_torch_merge(interpreted):
    """The merge kernels (atomic sums, then the means) give the torch
    merge's rows and cluster tokens: equal where the sums are exact
    (integer tokens and weights), within fp32 round-off of the sums' order
    with log-weights (measured 2.4e-7 on tokens in {-1, 0, 1}); with both
    scales clustered and with an identity scale."""
    cases = interpreted['merge']
    assert len(cases) == 12
    assert {c['identity'] for c in cases.values()} == {True, False}
    for key, case in cases.items():
        assert case['rows'], key
        bound = 1e-6 if key.endswith('-log') else 0.0
        assert case['diff'] <= bound, (key, case['diff'])


@pytest.mark.slow
@needs_triton
def test_tf32x3_reaches_kernels_and_gives_reference_ids(interpreted):
    """precision='tf32x3' from the plan reaches the kernels (the constexpr
    of their tl.dot) with its tie threshold, and on integer tokens (exact
    as 3xTF32) the ids equal the reference's with that threshold, also
    where near-duplicate pairs fall between the two thresholds. (Triton's
    interpreter computes tl.dot in plain fp32 whatever its precision, so
    this checks the plumbing and the tolerance path; the kernels' tf32x3
    code is checked by compiling it, below.)"""
    from clustr_mm.ops.dpc_knn.reference import tie_tolerance
    results = interpreted['tf32x3']
    assert len(results) == 6
    bad = [k for k, v in results.items() if not v['same']]
    assert not bad, bad
    for key, v in results.items():
        (precision, tie, c), = v['seen']
        assert precision == 'tf32x3', key
        assert tie == pytest.approx(tie_tolerance(c, 'tf32x3')), key


def test_near_duplicates_tell_the_thresholds_apart():
    """The near-duplicate case of the test above is one: its pairs are
    ties at the 'tf32x3' threshold and not at the 'ieee' one, so their
    ids differ between the two thresholds."""
    from clustr_mm.ops.dpc_knn.reference import augment, first_duplicate
    x = near_duplicates(2, 90, 8)
    firsts = []
    for precision in ('ieee', 'tf32x3'):
        rows, cols, tie = augment(x, precision=precision)
        firsts.append(first_duplicate(torch.bmm(rows, cols), tie))
    assert (firsts[1][:, 1::3] == torch.arange(0, 90, 3)).all()
    assert (firsts[0][:, 1::3] == torch.arange(1, 90, 3)).all()
    ids = [dpc_knn_assign_emulated(x, (9, 10), None, 2),
           dpc_knn_assign_ieee(x, (9, 10), None, 2)]
    assert not all(torch.equal(a, b) for a, b in zip(*ids))


def dpc_knn_assign_ieee(x, hw, ws, sr):
    """Ids of the reference backend."""
    from clustr_mm.ops.dpc_knn import TRACE_PLAN, WindowLayout, assign_clusters
    return assign_clusters(x, WindowLayout(hw, ws, sr,
                                           plan=TRACE_PLAN)).scales


def test_tf32_split_and_emulated_error_bound():
    """The emulated 3xTF32 products: hi and lo carry 10 explicit bits, the
    split is exact on small integers (then the distances equal IEEE's),
    and on random tokens the distance error (against fp64) stays inside
    the 'tf32x3' tie bound, identical tokens under the threshold."""
    from clustr_mm.ops.dpc_knn.reference import (augment, tf32_split,
                                                 tf32x3_bmm, tie_tolerance)
    torch.manual_seed(0)
    x = torch.randn(3, 200, 64) * torch.logspace(-3, 3, 200)[:, None]
    hi, lo = tf32_split(x)
    for part in (hi, lo):
        assert (part.view(torch.int32) & 0x1FFF == 0).all()
    assert ((x - hi).abs() <= 2.0**-11 * x.abs()).all()
    assert ((x - hi - lo).abs() <= 2.0**-22 * x.abs()).all()
    ints = torch.randint(-50, 51, (2, 40, 16)).float()
    rows, cols, _ = augment(ints)
    assert torch.equal(tf32x3_bmm(rows, cols), torch.bmm(rows, cols))
    x = torch.randn(2, 300, 64) * torch.rand(2, 300, 1) * 10
    x[:, 150:] = x[:, :150]  # identical pairs
    rows, cols, tie = augment(x, precision='tf32x3')
    d = tf32x3_bmm(rows, cols)
    xd = x.double()
    exact = torch.cdist(xd, xd).pow(2)
    sq = xd.pow(2).sum(-1)
    scale = torch.maximum(sq[:, :, None], sq[:, None, :])
    err = ((d.double() - exact).abs() / scale).max()
    assert err <= tie_tolerance(64, 'tf32x3')
    # and it is not IEEE arithmetic: the error exceeds fp32's
    fp32 = ((torch.bmm(*augment(x)[:2]).double() - exact).abs() / scale)
    assert err > fp32.max()
    same = d.diagonal(150, 1, 2)
    assert (same <= tie[:, :150]).all()


def test_unknown_precision_is_refused():
    from clustr_mm.models.layers.dpc_knn import DPCKNN
    from clustr_mm.ops.dpc_knn.reference import tie_tolerance
    with pytest.raises(ValueError, match=r"precision must be one of "
                       r"\('ieee', 'tf32x3'\), got 'tf32'"):
        DPCKNN(2, precision='tf32')
    from clustr_mm.ops.dpc_knn import FUSED_PLAN
    with pytest.raises(ValueError, match=r"plan.precision 'tf32x3' and "
                       r"precision 'ieee' disagree"):
        DPCKNN(2, plan=FUSED_PLAN._replace(precision='tf32x3'),
               precision='ieee')
    assert DPCKNN(2, plan=FUSED_PLAN._replace(precision='tf32x3'),
                  precision='tf32x3').precision == 'tf32x3'
    with pytest.raises(ValueError, match='precision'):
        tie_tolerance(8, 'bf16')
    assert tie_tolerance(8, 'tf32x3') == 3.5 * tie_tolerance(8)


def test_backbone_reducer_config_sets_precision():
    """ClusTR's ``reducers`` config carries the precision to every stage's
    reducer, and from there into its plan; the default is 'tf32x3', or a
    given plan's."""
    from clustr_mm.models.backbones.clustr import ClusTR
    from clustr_mm.models.layers.dpc_knn import DPCKNN
    for precision in ('ieee', 'tf32x3'):
        model = ClusTR('tiny', reducers=dict(type='DPCKNN',
                                             precision=precision))
        found = [m for m in model.modules()
                 if isinstance(m, DPCKNN)]
        assert found and all(m.precision == precision for m in found)
        layout = found[0].layout((8, 8), torch.device('cpu'))
        assert layout.plan.precision == precision
    model = ClusTR('tiny')
    assert all(m.precision == 'tf32x3' for m in model.modules()
               if isinstance(m, DPCKNN))
    from clustr_mm.ops.dpc_knn import FUSED_PLAN
    assert DPCKNN(2, plan=FUSED_PLAN).precision == FUSED_PLAN.precision


@pytest.mark.slow
@needs_triton
def test_pass1_equals_full_distance_matrix(interpreted):
    assert len(interpreted['pass1']) == len(PASS1_CASES)
    bad = {k: v for k, v in interpreted['pass1'].items() if not all(v)}
    assert not bad, bad  # [tie, knn values, rowmax, first] equal


@pytest.mark.slow
@needs_triton
@pytest.mark.parametrize('mode', ['exact', 'window'])
def test_clustr_t_through_fused_op_equals_reference(interpreted, mode):
    assert interpreted['model'][mode] <= 1e-5, interpreted['model']


@pytest.mark.skipif(TORCH < (2, 4), reason='torch.library.custom_op is '
                    f'torch >= 2.4; torch {torch.__version__} runs the code '
                    'directly')
def test_fused_op_is_one_op_with_shapes_and_flops():
    from torch.utils.flop_counter import FlopCounterMode

    from clustr_mm.analysis.op_census import op_census
    from clustr_mm.ops.dpc_knn import FUSED_PLAN, WindowLayout, assign_clusters
    from clustr_mm.ops.dpc_knn.fused import dpc_knn_flops
    layout = WindowLayout((12, 12), None, 2, plan=FUSED_PLAN)
    x = torch.randn(2, 144, 8)
    census = op_census(lambda: assign_clusters(x, layout))
    assert census['by_op'].get('dpc_knn') == 1, census['by_op']
    assert layout.clustered == [0] and layout.totals == [36, 144]
    with FlopCounterMode(display=False) as counter:
        assign_clusters(x, layout)
    assert counter.get_total_flops() == dpc_knn_flops(2, 144, 8, 36) > 0
    with torch._subclasses.fake_tensor.FakeTensorMode():
        for precision in ('ieee', 'tf32x3'):
            fake = torch.ops.clustr_mm.dpc_knn(torch.empty(4, 30, 8), None,
                                               None, None, [7, 28], 5,
                                               precision)
            assert fake.shape == (2, 4, 30) and fake.dtype == torch.long


def ptx_instruction_census(ptx):
    """Static PTX instructions by kind: the distance products' FMAs against
    the k-nearest selection's compares, selects, warp shuffles and barriers
    (docs/benchmarks.md, the first GPU figures: where ClusTR's time goes)."""
    ops = collections.Counter(
        m.group(1).split('.')[0] for m in re.finditer(
            r'^\s+(?:@!?%p\d+\s+)?([a-z][\w.]*)', ptx, re.M))
    kinds = ('fma', 'setp', 'selp', 'shfl', 'bar')
    return dict(total=sum(ops.values()), **{k: ops[k] for k in kinds})


def _ptxas_usage(kernel, arch):
    """(registers, spill store bytes, spill load bytes) from ptxas -v."""
    from triton.backends.nvidia.compiler import get_ptxas
    text = kernel.asm['ptx']
    target = re.search(r'\.target (\w+)', text).group(1)  # sm_90a for 90
    ptx = HERE / f'.ptx_{os.getpid()}_{arch}.ptx'
    ptx.write_text(text)
    try:
        proc = subprocess.run(
            [get_ptxas(arch).path, '-v', f'--gpu-name={target}', str(ptx),
             '-o', os.devnull], capture_output=True, text=True, check=True)
    finally:
        ptx.unlink()
    text = proc.stdout + proc.stderr
    regs = int(re.search(r'Used (\d+) registers', text).group(1))
    stores, loads = map(int, re.search(
        r'(\d+) bytes spill stores, (\d+) bytes spill loads', text).groups())
    return regs, stores, loads


@pytest.mark.slow
@needs_triton
@pytest.mark.skipif(
    os.environ.get('TRITON_INTERPRET') == '1',
    reason='with TRITON_INTERPRET=1 the kernels are interpreter functions, '
    'which the ahead-of-time compile (triton.compile) cannot take: run this '
    'test without it')
@pytest.mark.parametrize('arch', [80, 90])
def test_kernels_compile_for_gpus(arch):
    """The kernels compile ahead of time for sm_80/sm_90 within the
    register budget and without spills. Runs in a fresh process: kernels
    interpreted earlier in this process (``fused_cases.interpreted``) leave
    interpreter functions referenced, which ``triton.compile`` refuses."""
    code = (f'import sys; sys.path.insert(0, {str(HERE)!r}); '
            f'import test_dpc_knn_fused as t; t.compile_and_check({arch})')
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True,
                          text=True, timeout=900)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def compile_and_check(arch):
    """Compile every kernel for ``arch`` in the layouts the op launches
    (ClusTR's 64, 128 and 256 channels: rows loaded once or per tile) and
    the same with pass 2 pruned (``kernel_config(..., prune=True)``), and
    check ptxas's usage; for pass 1 at 64 channels in 'tf32x3' (stage 1),
    the
    tile loop's instructions per distance and that the selection adds no
    shuffle and no barrier to it (the two barriers left stage the column
    tile in shared memory for the tensor-core products)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from clustr_mm.ops.dpc_knn import fused as f
    device = torch.device('cuda', 0)
    f._arch = lambda _: arch // 10  # noqa: E731 (this process: no GPU)
    rows = dict(x_ptr='*fp32', lo_ptr='*fp32', sq_ptr='*fp32',
                tie_ptr='*fp32')
    # name: (kernel, signature, constants, warps, stages)
    kernels = {'_prep_kernel': (f._prep_kernel, dict(
        x_ptr='*fp32', pad_ptr='*u8', hi_ptr='*fp32', lo_ptr='*fp32',
        sq_ptr='*fp32', tie_ptr='*fp32', total='i32'), dict(
        TIE=1e-5, C=64, BLOCK_R=32, BLOCK_C=64, HAS_PAD=True, SPLIT=True),
        4, 3),
        '_pending_kernel': (f._pending_kernel, dict(
            sq_ptr='*fp32', tie_ptr='*fp32', order_ptr='*i64',
            rho_ptr='*fp32', rowmax_ptr='*fp32', near_ptr='*i32',
            near_d_ptr='*fp32', delta2_ptr='*fp32', score_ptr='*fp32',
            dmax2_ptr='*fp32', pending_ptr='*i32', count_ptr='*i32',
            n='i32'), dict(C=64, BLOCK=f.PENDING_BLOCK), 4, 1)}
    for c in (64, 128, 256):  # ClusTR's clustered stages
        for precision in ('ieee', 'tf32x3'):  # the products' precisions
            # the layout, and the same pruned (where kernel_config has one)
            for config in {f.kernel_config(device, c, precision, prune)
                           for prune in (False, True)}:
                pruned = '-pruned' if config.prune_denser else ''
                name = f'{precision}-{c}{pruned}'
                tiles = dict(BLOCK=f.BLOCK, BLOCK_C=f.BLOCK_C, C=c,
                             PRECISION=precision, ROWS_ONCE=config.rows_once)
                kernels[f'_knn_kernel-{name}'] = (f._knn_kernel, dict(
                    rows, scale_ptr='*fp32', knn_ptr='*fp32',
                    rho_ptr='*fp32', rowmax_ptr='*fp32', first_ptr='*i64',
                    near_ptr='*i32', near_d_ptr='*fp32', n='i32'),
                    dict(tiles, K=5, BLOCK_N=f.KNN_BLOCK_N, MASKED=False,
                         HAS_SCALE=False, LIBDEVICE=True,
                         NEAREST=config.prune_denser), config.warps,
                    config.stages)
                kernels[f'_denser_kernel-{name}'] = (
                    f._denser_kernel, dict(
                        rows, order_ptr='*i64', rho_ptr='*fp32',
                        rowmax_ptr='*fp32', dmax2_ptr='*fp32',
                        pending_ptr='*i32', count_ptr='*i32',
                        delta2_ptr='*fp32', score_ptr='*fp32', n='i32'),
                    dict(tiles, BLOCK_N=f.DENSER_BLOCK_N, MASKED=False,
                         PENDING=config.prune_denser),
                    config.denser_warps, config.stages)
            kernels[f'_assign_kernel-{precision}-{c}'] = (
                f._assign_kernel, dict(
                    rows, centers_ptr='*i64', slots_ptr='*u8',
                    out_ptr='*i64', n='i32', G='i32', num='i32',
                    count0='i32', center_stride='i32'),
                dict(tiles, S=2, HAS_SLOTS=True,
                     BLOCK_K=config.assign_block), f.ASSIGN_WARPS,
                config.stages)
    from clustr_mm.ops.dpc_knn import merge as mg
    tokens = dict(BLOCK_T=mg.MERGE_BLOCK_T, BLOCK_C=mg.MERGE_BLOCK_C)
    for c in (64, 128, 320):  # ClusTR-S's clustered stages
        kernels[f'_merge_sums_kernel-{c}'] = (mg._merge_sums_kernel, dict(
            x_ptr='*fp32', w_ptr='*fp32', ids_ptr='*i64', shift_ptr='*i64',
            sums_ptr='*fp32', rows_ptr='*i64', total='i32', n='i32',
            batch='i32', first_identity='i32'), dict(
            tokens, C=c, S=2, HAS_W=True, LOG_W=True, IDENTITY=True,
            LIBDEVICE=True), 4, 1)
        kernels[f'_merge_mean_kernel-{c}'] = (mg._merge_mean_kernel, dict(
            sums_ptr='*fp32', out_ptr='*fp32', num_rows='i32'), dict(
            tokens, C=c, EPS_=mg.EPS), 4, 1)
    usage = {}
    for name, (fn, sig, consts, warps, stages) in kernels.items():
        sig.update(dict.fromkeys(consts, 'constexpr'))
        src = ASTSource(fn, sig, consts)
        kernel = triton.compile(src, target=GPUTarget('cuda', arch, 32),
                                options=dict(num_warps=warps,
                                             num_stages=stages))
        assert kernel.asm['cubin'][:4] == b'\x7fELF'
        usage[name] = _ptxas_usage(kernel, arch)
        print(f'sm_{arch} {name} ({warps} warps, {stages} stages) PTX '
              f'instructions: {ptx_instruction_census(kernel.asm["ptx"])}')
        if name.startswith('_knn_kernel-tf32x3-64') and arch >= 90:
            per_thread = f.BLOCK * f.KNN_BLOCK_N // (32 * warps)
            loop = tile_loop_census(kernel.asm['ptx'], 1, per_thread)
            print(f'sm_{arch} {name} tile loop: {loop}')
            assert loop['shfl'] == 0 and loop['bar'] <= 2, loop
            # 39.6 with the measured layout (Triton 3.6 and 3.8); pruned,
            # the nearest column adds a compare and a select: 41.6
            assert loop['per_distance'] <= (
                42 if name.endswith('-pruned') else 40), loop
    print(f'sm_{arch} (registers, spill stores, spill loads): {usage}')
    for name, (regs, stores, loads) in usage.items():
        assert regs <= 255 and stores == loads == 0, (name, usage)


def tile_loop_census(ptx, trips, distances):
    """Instructions of pass 1's tile loop (the outermost loop of the PTX,
    found by its backward branch): per kind (shuffles, barriers) and per
    distance. A loop nested in it (the channel steps) counts ``trips``
    times; ``distances``: distances a thread computes per tile."""
    lines = ptx.splitlines()
    labels = {m.group(1): i for i, line in enumerate(lines)
              for m in [re.match(r'^(\$L__\w+):', line.strip())] if m}
    loops = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             for m in [re.search(r'\bbra(?:\.uni)?\s+(\$L__\w+);', line)]
             if m and labels.get(m.group(1), i) < i]
    start, stop = max(loops, key=lambda span: span[1] - span[0])
    inner = [(a, b) for a, b in loops if start < a and b < stop]

    def kinds(a, b):
        return collections.Counter(
            m.group(1).split('.')[0] for line in lines[a:b + 1]
            for m in [re.match(r'^\s+(?:@!?%p\d+\s+)?([a-z][\w.]*)', line)]
            if m)
    ops = kinds(start, stop)
    for a, b in inner:  # executed trips times, counted once above
        for op, count in kinds(a, b).items():
            ops[op] += count * (trips - 1)
    total = sum(ops.values())
    return dict(instructions=total, per_distance=round(total / distances, 1),
                shfl=ops['shfl'], bar=ops['bar'], mma=ops['mma'] +
                ops['wgmma'], selection=ops['min'] + ops['max'])


@needs_triton
@pytest.mark.parametrize('prune', [False, True], ids=['full', 'pruned'])
def test_fused_op_launches_at_most_15(monkeypatch, prune):
    """One clustering call (two scales, padded windows; the op's body)
    launches 4 Triton kernels (5 with pass 2 pruned: the layout
    :func:`fused.kernel_config` gives, here set as a measured one) and 3
    torch ops (a gather, two sorts): at most 15 launches (the op census's
    ops, allocations excluded, plus the kernels), about 60 before the
    kernels took the steps between them."""
    from torch.utils._python_dispatch import _disable_current_modes

    from clustr_mm.analysis.op_census import OpCensus
    from clustr_mm.ops.dpc_knn import fused
    from fused_cases import interpreted, windows
    x, counts, consts = windows((9, 12), 8, 4, 16, 2)
    assert len(counts) == 2 and consts.invalid is not None
    kernels = []

    class Counted:
        """A kernel whose launches are counted, outside the census."""
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                kernels.append(self.name)
                with _disable_current_modes():
                    return self.kernel[grid](*args, **kwargs)
            return launch

    names = ('_prep_kernel', '_knn_kernel', '_pending_kernel',
             '_denser_kernel', '_assign_kernel')
    monkeypatch.setattr(fused, 'INTERPRET', True)  # kernels on CPU tensors
    monkeypatch.setitem(fused.MEASURED, (9, 16, 'tf32x3'), fused.kernel_config(
        x.device, 16, 'tf32x3')._replace(prune_denser=prune))
    census = OpCensus()
    with interpreted(fused):
        saved = {n: getattr(fused, n) for n in names}
        try:
            for n in names:
                setattr(fused, n, Counted(n, saved[n]))
            with census:  # the op's body, as the custom op runs it
                fused._dpc_knn(x, consts.invalid, consts.knn_scale,
                               consts.center_slots, counts, 5, 'tf32x3')
        finally:
            for n, k in saved.items():
                setattr(fused, n, k)
    torch_ops = {op: count for op, count in census.summary()['by_op'].items()
                 if not op.startswith(('empty', 'new_empty'))}
    print(f'[launches] {len(kernels)} kernels, torch {torch_ops}')
    assert kernels == [n for n in names
                       if prune or n != '_pending_kernel'], kernels
    assert len(kernels) + sum(torch_ops.values()) <= 15, torch_ops
    # nothing else: no constants made per call (a new_tensor would be a
    # host-to-device copy that waits for the stream on a GPU)
    assert torch_ops == dict(sort=2, gather=1), torch_ops


@needs_triton
@pytest.mark.parametrize('k', [1, 2, 3, 4, 6, 7, 8])
def test_pass1_keeps_any_k_up_to_max(k):
    """Pass 1's per-lane lists for every k it takes (ClusTR uses 5, the
    interpreted cases above): the k smallest distances (duplicates as 0),
    on integer tokens whose nearest all share one lane; k above MAX_K is
    refused."""
    from clustr_mm.ops.dpc_knn import fused
    from clustr_mm.ops.dpc_knn.reference import augment
    from fused_cases import interpreted
    n, c = 288, 32
    j = torch.arange(n)
    x = torch.zeros(1, n, c)
    # rows 32 apart: the 9 of a lane are each other's nearest (distance 2)
    x[0, j, j % 32] = 16.0
    x[0, j, (j // 32 + 5) % c] += 1.0
    x[0, j[::7], (3 * j[::7] + k) % c] += 2.0  # integers: exact sums
    with interpreted(fused):
        hi, lo, sq, tie = fused._prep(x, None, 'ieee')
        knn = fused._knn_pass(hi, lo, sq, tie, None, k, 'ieee')[0]
        with pytest.raises(ValueError, match='k in'):
            fused._knn_pass(hi, lo, sq, tie, None, fused.MAX_K + 1, 'ieee')
    rows, cols, tie = augment(x)
    d = torch.bmm(rows, cols)
    d.diagonal(dim1=1, dim2=2).zero_()
    near = d.topk(k, -1, largest=False).values
    near = near.masked_fill(near <= tie[..., None], 0.0)
    assert torch.equal(knn, near)

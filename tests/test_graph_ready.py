"""GPU-minded forward passes: no host syncs, few ops, compile and trace ready.

The op census (``clustr_mm.analysis.op_census``) counts the aten ops that do
work and the host syncs of one eval forward on the CPU; on a GPU each op is
at least one kernel launch and each sync stalls the host. The targets are
the project's: ClusTR-S at 224 and in windows at larger sizes, batch 2,
<= 450 ops (issue 54) and no sync; PaCa-S no sync. The launches inside the
clustering op (its CUDA path) are counted per call too.
"""
import pytest
import torch
from conftest import TORCH
from torch import nn
from mmengine.analysis import get_model_complexity_info
from mmengine.registry import MODELS

import clustr_mm  # noqa: F401
from clustr_mm.analysis.flops import analyze_flops
from clustr_mm.analysis.op_census import op_census
from clustr_mm.analysis.traffic import traffic_census
from clustr_mm.models.backbones.clustr import ClusTR
from clustr_mm.models.layers import SummaryAttention
from clustr_mm.models.layers.dpc_knn import use_plan
from clustr_mm.ops.dpc_knn import (ACCELERATOR_PLAN, CPU_PLAN, FUSED_PLAN,
                                   fused)

# `torch21` marks the tests that also run on the torch 2.1 stack; the census
# of the fused op (torch.library.custom_op) and torch.compile need torch >= 2.4.
torch.set_num_threads(2)



@pytest.fixture(autouse=True)
def _fused_body_without_kernels(monkeypatch):
    """These tests count and trace the ops around the fused clustering op;
    on a CPU its body runs the blocked backend, unless TRITON_INTERPRET=1
    makes it run the Triton kernels in the interpreter: minutes per forward
    at ClusTR-S's sizes, and nothing these tests look at (the kernels are
    checked under the interpreter by tests/test_dpc_knn_*.py). Keep the
    blocked body here either way."""
    if fused.INTERPRET:
        monkeypatch.setattr(fused, 'runs_kernels', lambda x: False)


# ClusTR-S's depths, heads and ratios at a quarter of its width: the op
# sequence depends on depths, grids and windows only (checked below against
# ClusTR-S itself at 224), and the census runs faster.
NARROW_S = dict(ClusTR.arch_zoo['small'], embed_dims=(16, 32, 64, 128))
# One block per stage, for compiling in reasonable time on two cores.
ONE_BLOCK = dict(embed_dims=(16, 32, 64, 64), depths=(1, 1, 1, 1),
                 num_heads=(1, 2, 4, 4), mlp_ratios=(2, 2, 2, 2))


def _census(cfg, hw, batch=2, plan=FUSED_PLAN):
    """The census of the CUDA path (the fused op), on the CPU."""
    model = MODELS.build(cfg).eval()
    use_plan(model, plan)
    x = torch.randn(batch, 3, *hw)
    return op_census(lambda: model(x))


@pytest.mark.skipif(
    not hasattr(torch.library, 'custom_op'),
    reason='the CUDA path counts the fused clustering as one op, which needs '
    'torch.library.custom_op (torch >= 2.4); older torch runs its body op by '
    'op')
@pytest.mark.parametrize('mode', ['exact', 'window'])
def test_clustr_s_census_at_224(mode):
    narrow = _census(dict(type='ClusTR', arch=NARROW_S,
                          clustering_mode=mode), (224, 224))
    assert narrow['host_syncs'] == 0, narrow['by_op']
    assert narrow['ops'] <= 450, narrow['by_op']
    # ClusTR-S's 21 clustering attentions: one op each, whose CUDA path
    # launches the fused DPC-kNN's 7 or 8 and the merge's 3; in windows
    # the windows' cut (pad, copy) and the ids' way back (offsets, gather)
    assert narrow['by_op']['dpc_knn_merge'] == 21
    per_call = narrow['launches_per_call']['dpc_knn_merge']
    assert 10 <= per_call <= (11 if mode == 'exact' else 15), per_call
    assert narrow['launches'] >= narrow['ops'] + 9 * 21
    if mode == 'window':  # the narrow model stands for ClusTR-S
        full = _census(dict(type='ClusTR', arch='small',
                            clustering_mode=mode), (224, 224))
        assert full['by_op'] == narrow['by_op']


@pytest.mark.skipif(
    not hasattr(torch.library, 'custom_op'),
    reason='counts the CUDA path, whose clustering is one op from torch 2.4')
@pytest.mark.parametrize('mode', ['exact', 'window'])
def test_bf16_autocast_casts_only_weights_image_and_fp32_island(mode):
    """Under bf16 autocast a forward casts each weight and bias of the
    layers autocast runs in bf16 once, the image once, and per clustering
    attention its tokens to fp32 once (for the clustering, the merge and the
    fp32 token weights, whose layer is therefore not cast) and the cluster
    tokens of all scales back once."""
    model = MODELS.build(dict(type='ClusTR', arch=NARROW_S,
                              clustering_mode=mode)).eval()
    use_plan(model, FUSED_PLAN)
    x = torch.randn(1, 3, 64, 64)

    def forward():
        with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
            model(x)

    casts = traffic_census(forward)['op_counts']['_to_copy']
    attns = [m for m in model.modules()
             if isinstance(m, SummaryAttention) and m.clustering is not None]
    fp32 = {id(p) for a in attns for p in a.weight_layer.parameters()}
    weights = [p for m in model.modules()
               if isinstance(m, (nn.Linear, nn.Conv2d))
               for p in m.parameters(recurse=False) if id(p) not in fp32]
    assert len(attns) == 21  # ClusTR-S's stages 1-3
    assert casts == len(weights) + 1 + 2 * len(attns), casts


@pytest.mark.torch21
def test_clustr_s_census_grows_little_with_the_image():
    cfg = dict(type='ClusTR', arch=NARROW_S, clustering_mode='window')
    base = _census(cfg, (224, 224))['ops']
    # 480x800: detection's aspect, border windows both ways (120 x 200 tokens
    # in 56-token windows), at a third of 800x1344's CPU time
    for hw in [(512, 512), (480, 800)]:
        counted = _census(cfg, hw)
        assert counted['host_syncs'] == 0, (hw, counted['by_op'])
        assert counted['ops'] <= 1.3 * base, (hw, counted['ops'], base)
        if hasattr(torch.library, 'custom_op'):  # the clustering one op
            assert counted['ops'] <= 450, (hw, counted['by_op'])


@pytest.mark.torch21
@pytest.mark.parametrize('plan', [CPU_PLAN, ACCELERATOR_PLAN],
                         ids=['cpu-plan', 'accelerator-plan'])
def test_other_plans_have_no_sync_either(plan):
    counted = _census(dict(type='ClusTR', arch=NARROW_S,
                           clustering_mode='window'), (512, 512), plan=plan)
    assert counted['host_syncs'] == 0, counted['by_op']


@pytest.mark.torch21
def test_paca_s_census_has_no_sync():
    counted = _census(dict(type='PaCaViT', arch='small'), (224, 224))
    assert counted['host_syncs'] == 0, counted['by_op']


@pytest.mark.torch21
def test_census_sees_a_host_sync():
    """The census would catch a data-dependent decision coming back."""
    model = MODELS.build(dict(type='ClusTR', arch=ONE_BLOCK)).eval()
    x = torch.randn(1, 3, 64, 64)
    counted = op_census(lambda: int(model(x)[0].argmax()))
    assert counted['host_syncs'] >= 1


# Windows of 8, 4, 2 tokens on 20x24, 10x12, 5x6 grids: border windows,
# padded into one call (accelerator plan) or one call per shape (CPU plan).
CLUSTR_WINDOW = dict(type='ClusTR', arch=ONE_BLOCK, clustering_mode='window',
                     window_size=8)
CLUSTR_EXACT = dict(type='ClusTR', arch=ONE_BLOCK, clustering_mode='exact')
# The CPU plan with blocks small enough that windows are split into
# density-ordered row blocks here too.
SPLIT_CPU_PLAN = CPU_PLAN._replace(max_chunk_elems=1 << 12)


@pytest.mark.skipif(
    TORCH < (2, 4), reason='dynamo of torch 2.1.2 cannot trace the size-only '
    'layout set-up (torch.tensor of traced sizes); passes on 2.14.1, versions '
    'between are untested')
# Inductor (what users compile with) for the plans a GPU runs and for PaCa;
# the CPU plans and the fused op through 'aot_eager': the same whole-graph
# capture and functionalisation, without inductor's C++ build (30-50 s a
# case on a 2-core CPU).
@pytest.mark.parametrize('cfg,hw,plan,backend', [
    (CLUSTR_EXACT, (64, 64), ACCELERATOR_PLAN, 'inductor'),
    (CLUSTR_EXACT, (64, 64), SPLIT_CPU_PLAN, 'aot_eager'),
    (CLUSTR_WINDOW, (80, 96), ACCELERATOR_PLAN, 'inductor'),
    (CLUSTR_WINDOW, (80, 96), SPLIT_CPU_PLAN, 'aot_eager'),
    (CLUSTR_WINDOW, (80, 96), FUSED_PLAN, 'aot_eager'),
    (dict(type='PaCaViT', arch='tiny'), (64, 64), CPU_PLAN, 'inductor'),
], ids=['clustr-exact-accelerator-plan', 'clustr-exact-cpu-plan',
        'clustr-window-accelerator-plan', 'clustr-window-cpu-plan',
        'clustr-window-fused-op', 'paca'])
def test_compile_fullgraph_equals_eager(cfg, hw, plan, backend):
    torch.manual_seed(0)
    model = MODELS.build(cfg).eval()
    x = torch.randn(2, 3, *hw)
    torch._dynamo.reset()  # no recompilation (with dynamic shapes) of an
    # earlier case's frames: each case compiles once, for its own sizes
    use_plan(model, plan)
    with torch.no_grad():
        eager = model(x)
        compiled = torch.compile(model, fullgraph=True, dynamic=False,
                                 backend=backend)(x)
    assert len(compiled) == len(eager)
    for a, b in zip(compiled, eager):
        assert a.shape == b.shape
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)


@pytest.mark.torch21
@pytest.mark.parametrize('mode,hw', [('exact', (224, 224)),
                                     ('window', (224, 256))])
def test_jit_traced_flop_count_matches_ours(mode, hw):
    """mmengine's jit-trace counter (what the get_flops.py of mmdet,
    mmpretrain and mmpose call) traces the backbone and agrees with our
    count, also where border windows exist (224x256: 56x64 tokens in 56-token
    windows): a trace runs the unpadded, unsplit layout. It does not count
    the clustering's comparisons and merge (under 1% here)."""
    model = MODELS.build(dict(type='ClusTR', arch='tiny',
                              clustering_mode=mode)).eval()
    x = torch.rand(1, 3, *hw)
    ours = analyze_flops(model, x).total
    traced = get_model_complexity_info(
        model, inputs=(x, ), show_table=False, show_arch=False)['flops']
    assert abs(traced - ours) / ours < 0.01, (traced, ours)


@pytest.mark.parametrize('cfg,hw', [
    (dict(CLUSTR_EXACT), (64, 64)),
    (dict(CLUSTR_WINDOW), (80, 96)),
    (dict(type='PaCaViT', arch=ONE_BLOCK, num_clusters=(5, 6, 7, 0)),
     (64, 80)),
], ids=['clustr-exact', 'clustr-window', 'paca'])
def test_jit_trace_equals_eager(cfg, hw):
    """A torch.jit.trace of each backbone gives the eager outputs, on the
    traced input and on another input of the same size (the trace must not
    have frozen data-dependent values such as cluster ids)."""
    torch.manual_seed(0)
    model = MODELS.build(cfg).eval()
    x, other = torch.randn(2, 2, 3, *hw)
    with torch.no_grad():
        traced = torch.jit.trace(model, (x, ), check_trace=False)
        for inputs in (x, other):
            eager, got = model(inputs), traced(inputs)
            assert len(got) == len(eager)
            for a, b in zip(got, eager):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)

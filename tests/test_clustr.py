"""ClusTR backbone, DPC-kNN clustering and the official-weights converter."""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import clustr_mm  # noqa: F401  (registers the models)
from clustr_mm.models.backbones.clustr import ClusTR
from clustr_mm.models.layers import ConvFFN
from clustr_mm.models.layers.cluster_attention import ClusterAttention
from clustr_mm.models.layers.dpc_knn import DPCKNN, merge_clusters
from clustr_mm.ops.dpc_knn import (ACCELERATOR_PLAN, CPU_PLAN, ClusterIds,
                                   WindowLayout, batch_consts, assign_clusters)
from clustr_mm.ops.dpc_knn import blocked
from clustr_mm.ops.dpc_knn.blocked import k_smallest

pytestmark = pytest.mark.torch21

REPO = Path(__file__).resolve().parents[1]
torch.set_num_threads(2)


# --------------------------------------------------------------------------
# A literal DPC-kNN, straight from the specification (O(N^2) Python loops).
def reference_dpc_knn(tokens, counts, k=5):
    """Per token, the rank (by score) of its cluster's center, per count."""
    pts = tokens.tolist()
    n, c = len(pts), len(pts[0])
    dist = [[math.sqrt(sum((a - b)**2 for a, b in zip(p, q)) / c)
             for q in pts] for p in pts]
    rho = []
    for i in range(n):
        nearest = sorted(d * d for d in dist[i])[:min(k, n)]  # self included
        rho.append(math.exp(-sum(nearest) / len(nearest)))
    largest = max(max(row) for row in dist)
    delta = []
    for i in range(n):
        # Ties in density: the lower index counts as denser.
        denser = [dist[i][j] for j in range(n)
                  if rho[j] > rho[i] or (rho[j] == rho[i] and j < i)]
        delta.append(min(denser) if denser else largest)
    score = [r * d for r, d in zip(rho, delta)]
    ranking = sorted(range(n), key=lambda i: (-score[i], i))
    result = []
    for m in counts:
        centers = ranking[:m]
        assign = []
        for i in range(n):
            if i in centers:
                assign.append(centers.index(i))
            else:
                assign.append(min(range(m),
                                  key=lambda j: (dist[i][centers[j]], j)))
        result.append(assign)
    return result


# Every clustering plan must give the reference's clusters (they differ
# only in how the work is laid out: padding, block sizes, kNN search).
PLANS = pytest.mark.parametrize('plan', [ACCELERATOR_PLAN, CPU_PLAN],
                                ids=['accelerator-plan', 'cpu-plan'])


@PLANS
def test_exact_mode_matches_reference(plan):
    torch.manual_seed(0)
    h, w, sr = 7, 9, 2
    x = torch.randn(3, h * w, 8)
    # A tiny chunk budget exercises the row-chunked path as well.
    for budget in (1 << 20, 100):
        layout = WindowLayout((h, w), None, sr, plan=plan._replace(
            max_chunk_elems=budget))
        assert layout.totals == [15, 60]
        ids = assign_clusters(x, layout).scales
        for b in range(3):
            ref = reference_dpc_knn(x[b], [15, 60])
            for s in range(2):
                assert ids[s][b].tolist() == ref[s]


@PLANS
@pytest.mark.parametrize('h,w', [(11, 13), (10, 13), (11, 15), (10, 15)])
def test_window_mode_matches_reference_per_window(h, w, plan):
    """Border windows on either side or none: (10, 15) is tiled by six full
    windows, whose cluster ids must not overlap (they once did whenever a
    side held several full windows and no border window)."""
    torch.manual_seed(1)
    ws, sr = 5, 2
    x = torch.randn(2, h * w, 6)
    # one window per call; the CPU plan also splits a window's rows
    layout = WindowLayout((h, w), ws, sr, plan=plan._replace(
        max_chunk_elems=64 if plan.pad_windows else 20))
    ids = assign_clusters(x, layout).scales
    for b in range(2):
        grid = x[b].reshape(h, w, -1)
        expected = [torch.empty(h, w, dtype=torch.long) for _ in range(2)]
        offsets = [0, 0]
        for i0 in range(0, h, ws):
            for j0 in range(0, w, ws):
                win = grid[i0:i0 + ws, j0:j0 + ws]
                n = win.shape[0] * win.shape[1]
                coarse = max(1, n // sr**2)
                counts = [coarse, min(4 * coarse, n)]  # documented rule
                ref = reference_dpc_knn(win.reshape(n, -1), counts)
                for s in range(2):
                    expected[s][i0:i0 + ws, j0:j0 + ws] = (
                        torch.tensor(ref[s]).reshape(win.shape[:2]) +
                        offsets[s])
                    offsets[s] += counts[s]
        for s in range(2):
            assert torch.equal(ids[s][b], expected[s].flatten())
    assert layout.totals == offsets


def test_plans_agree_on_long_rows():
    """Rows long enough for the CPU plan's blocked kNN (2304 tokens, 36
    blocks of 64) and its density-ordered row blocks: the same clusters as
    the accelerator plan's plain topk over one kept block."""
    torch.manual_seed(3)
    x = torch.randn(2, 48 * 48, 16)
    ids = [assign_clusters(x, WindowLayout((48, 48), None, 4,
                                           plan=plan)).scales
           for plan in (ACCELERATOR_PLAN, CPU_PLAN)]
    for a, b in zip(*ids):
        assert torch.equal(a, b)


def test_k_smallest_equals_topk():
    torch.manual_seed(4)
    d = torch.rand(3, 5, 64 * 40 + 17)
    d[0, 0, 100:300] = float('inf')  # padding columns
    expected = d.topk(5, dim=-1, largest=False).values
    assert torch.equal(k_smallest(d, 5), expected)


def test_window_mode_equals_exact_when_one_window_covers_grid():
    torch.manual_seed(2)
    for hw in [(7, 7), (4, 7)]:
        x = torch.randn(2, hw[0] * hw[1], 8)
        exact = assign_clusters(x, WindowLayout(hw, None, 2,
                                                plan=CPU_PLAN)).scales
        window = assign_clusters(x, WindowLayout(hw, 7, 2,
                                                 plan=CPU_PLAN)).scales
        for a, b in zip(exact, window):
            assert torch.equal(a, b)


def test_identity_scale_and_ties_are_deterministic():
    x = torch.zeros(2, 16, 4)  # every token identical: all ties
    layout = WindowLayout((4, 4), None, 2, plan=CPU_PLAN)
    assert layout.identity == [False, True]
    ids = assign_clusters(x, layout).scales
    assert torch.equal(ids[1], torch.arange(16).expand(2, -1))
    assert ids[0][0].tolist() == reference_dpc_knn(x[0], [4])[0]
    assert torch.equal(ids[0], assign_clusters(x, layout).scales[0])


def test_merge_is_weighted_mean():
    torch.manual_seed(3)
    x, w = torch.randn(2, 10, 3), torch.rand(2, 10, 1) + 0.1
    ids = torch.randint(0, 4, (2, 10))
    # one scale of 4 clusters on 10 tokens (2 * max(1, 10 // 2**2))
    layout = WindowLayout((2, 5), None, 2, (2, ), plan=CPU_PLAN)
    assert layout.totals == [4]
    (out, ) = merge_clusters(
        x, w, ClusterIds([ids], ids[None], batch_consts(layout, 2, 3)),
        layout)
    for b in range(2):
        for m in range(4):
            member = ids[b] == m
            num = (x[b][member] * w[b][member]).sum(0)
            den = w[b][member].sum() + 1e-6
            torch.testing.assert_close(out[b, m], num / den)


def test_cluster_attention_sums_two_scales():
    torch.manual_seed(4)
    attn = ClusterAttention(16, 2, sr_ratio=2).eval()
    x, hw = torch.randn(1, 36, 16), (6, 6)
    out, ids = attn(x, hw)
    w = attn.weight_layer(x).exp()
    total = torch.zeros_like(x)
    layout = attn.clustering.layout(hw, x.device)
    assert layout.totals == [9, 36]
    assigned = assign_clusters(x, layout)
    assert all(torch.equal(a, b) for a, b in zip(assigned.scales, ids))
    merged = merge_clusters(x, w, assigned, layout)
    for kv, z in zip((attn.kv1, attn.kv2), merged):
        k, v = kv(z).chunk(2, -1)
        q = attn.q(x)
        for h in range(2):
            sl = slice(8 * h, 8 * h + 8)
            a = (q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(8))
            total[..., sl] += a.softmax(-1) @ v[..., sl]
    torch.testing.assert_close(out, attn.proj(total), rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# Backbone.
@pytest.mark.parametrize('arch,expected', [('tiny', 11.682), ('small', 22.691),
                                           ('base', 40.246)])
def test_parameter_counts_with_linear_head(arch, expected):
    model = ClusTR(arch)
    n = sum(p.numel() for p in model.parameters())
    n += sum(p.numel() for p in nn.Linear(512, 1000).parameters())
    assert abs(n / 1e6 - expected) / expected < 1e-3


def test_builds_from_registry():
    from mmengine.registry import MODELS
    model = MODELS.build(dict(type='ClusTR', arch='tiny', out_indices=(3, )))
    assert isinstance(model, ClusTR) and model.out_indices == (3, )


@pytest.mark.parametrize('kwargs,word', [
    (dict(arch='huge'), 'arch'),
    (dict(arch=dict(embed_dims=[8], depths=[1])), 'arch'),
    (dict(arch=dict(embed_dims=[10], depths=[1], num_heads=[3],
                    mlp_ratios=[4], sr_ratios=[1])), 'num_heads'),
    (dict(out_indices=(4, )), 'out_indices'),
    (dict(drop_path_rate=-0.1), 'drop_path_rate'),
    (dict(clustering_mode='fast'), 'clustering_mode'),
    (dict(frozen_stages=5), 'frozen_stages'),
])
def test_invalid_arguments_are_named(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ClusTR(**kwargs)


def test_wrong_input_channels_raise():
    with pytest.raises(ValueError, match=r'ClusTR expects images of shape '
                       r'\(B, 3, H, W\), got \(1, 1, 32, 32\)'):
        ClusTR('tiny')(torch.randn(1, 1, 32, 32))


@pytest.mark.parametrize('mode', ['exact', 'window'])
def test_odd_sizes_and_batch_one(mode):
    model = ClusTR('tiny', clustering_mode=mode, window_size=8).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 33, 47))
    assert [tuple(o.shape) for o in outs] == [(1, 64, 9, 12), (1, 128, 5, 6),
                                              (1, 256, 3, 3), (1, 512, 2, 2)]
    assert all(torch.isfinite(o).all() for o in outs)


def test_batch_items_are_independent():
    torch.manual_seed(5)
    model = ClusTR('tiny', out_indices=(3, )).eval()
    x = torch.randn(3, 3, 64, 96)
    with torch.no_grad():
        joint = model(x)[0]
        single = torch.cat([model(x[i:i + 1])[0] for i in range(3)])
    torch.testing.assert_close(joint, single, rtol=1e-4, atol=1e-4)


def test_window_equals_exact_at_224():
    torch.manual_seed(6)
    exact = ClusTR('tiny').eval()
    window = ClusTR('tiny', clustering_mode='window').eval()
    window.load_state_dict(exact.state_dict())
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        for a, b in zip(exact(x), window(x)):
            assert torch.equal(a, b)


def test_window_mode_large_input_has_bounded_chunks(monkeypatch):
    budget = 1 << 18
    model = ClusTR('tiny', clustering_mode='window', out_indices=(3, ),
                   max_chunk_elems=budget).eval()
    largest = []
    bmm = torch.bmm

    def recording_bmm(a, b, **kwargs):
        out = bmm(a, b, **kwargs)
        largest.append(out.numel())
        return out

    monkeypatch.setattr(blocked.torch, 'bmm', recording_bmm)
    with torch.no_grad():
        out = model(torch.randn(1, 3, 288, 544))[0]  # stage 1: 72 x 136
    assert out.shape == (1, 512, 9, 17)
    # A full stage-1 distance matrix would have (72 * 136)^2 ~ 96M elements.
    assert largest and max(largest) <= budget


def test_deterministic_across_runs():
    torch.manual_seed(7)
    model = ClusTR('tiny', clustering_mode='window', window_size=8,
                   keep_assignments=True).eval()
    x = torch.randn(2, 3, 96, 80)
    with torch.no_grad():
        first = model(x)
        ids = [a for s in model.assignments for b in s for a in b]
        second = model(x)
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    again = [a for s in model.assignments for b in s for a in b]
    assert len(ids) == len(again) == 2 * 9  # 2 scales, 9 clustering blocks
    assert all(torch.equal(a, b) for a, b in zip(again, ids))


def test_frozen_stages_and_norm_eval():
    model = ClusTR('tiny', frozen_stages=2).train()
    for i in range(4):
        frozen = i < 2  # the first two stages, with their patch embeddings
        part = model.stages[i]
        assert all(p.requires_grad != frozen for p in part.parameters())
        assert all(m.training != frozen for m in part.modules())
    # 0 freezes only the first patch embedding (the stem).
    model = ClusTR('tiny', frozen_stages=0).train()
    assert [all(not p.requires_grad for p in s.downsample.parameters())
            for s in model.stages] == [True, False, False, False]
    assert all(p.requires_grad for s in model.stages
               for p in s.blocks.parameters())
    model = ClusTR('tiny', norm_eval=True).train()
    for m in model.modules():
        assert m.training != isinstance(m, nn.LayerNorm)


def test_pretrained_init_cfg_survives_init_weights(tmp_path):
    source = ClusTR('tiny')
    source.init_weights()
    ckpt = tmp_path / 'ckpt.pth'
    torch.save({'state_dict': {f'backbone.{k}': v
                               for k, v in source.state_dict().items()}}, ckpt)
    model = ClusTR('tiny', init_cfg=dict(type='Pretrained',
                                         checkpoint=str(ckpt),
                                         prefix='backbone.'))
    model.init_weights()
    for k, v in source.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def test_gradients_reach_every_trainable_parameter():
    torch.manual_seed(8)
    model = ClusTR('tiny', drop_path_rate=0.1, frozen_stages=0).train()
    outs = model(torch.randn(2, 3, 64, 64))
    sum(o.square().mean() for o in outs).backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None, name


def test_bf16_autocast_keeps_fp32_assignments():
    torch.manual_seed(9)
    x = torch.randn(2, 14 * 14, 32)
    w = torch.rand(2, 14 * 14, 1) + 0.5
    clusterer = DPCKNN(2)
    fp32 = clusterer(x, (14, 14), w).assignments
    with torch.autocast('cpu', dtype=torch.bfloat16):
        bf16 = clusterer(x, (14, 14), w).assignments
    assert all(torch.equal(a, b) for a, b in zip(fp32, bf16))

    model = ClusTR('tiny').eval()
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        outs = model(torch.randn(1, 3, 64, 64))
    assert all(torch.isfinite(o.float()).all() for o in outs)


# --------------------------------------------------------------------------
# Converter.
def to_official(state_dict):
    """Our backbone keys -> the official code's keys (inverse of the map)."""
    official = {}
    for key, value in state_dict.items():
        key = re.sub(r'^stages\.(\d+)\.downsample',
                     lambda m: f'patch_embed{int(m[1]) + 1}', key)
        key = re.sub(r'^stages\.(\d+)\.blocks',
                     lambda m: f'block{int(m[1]) + 1}', key)
        key = re.sub(r'^stages\.(\d+)\.norm',
                     lambda m: f'norm{int(m[1]) + 1}', key)
        key = key.replace('.mlp.dwconv.', '.mlp.dwconv.dwconv.')
        official[key] = value
    return official


@pytest.mark.slow
def test_converter_round_trip(tmp_path):
    torch.manual_seed(10)
    model = ClusTR('tiny').eval()
    model.init_weights()
    head = nn.Linear(512, 1000)
    official = to_official(model.state_dict())
    official.update({'head.weight': head.weight.data,
                     'head.bias': head.bias.data})
    assert 'block1.0.attn.kv1.weight' in official
    assert 'block1.0.mlp.dwconv.dwconv.weight' in official
    src, dst = tmp_path / 'official.pth', tmp_path / 'converted.pth'
    torch.save({'model': official}, src)

    result = subprocess.run(
        [sys.executable, str(REPO / 'tools/model_converters/'
                             'clustr_official_to_mm.py'), str(src), str(dst)],
        capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert 'arch: tiny' in result.stdout
    for line in ('missing: 0', 'unexpected: 0', 'shape_mismatch: 0'):
        assert line in result.stdout

    converted = torch.load(dst, weights_only=True)
    state = converted['state_dict']
    assert torch.equal(state['head.fc.weight'], head.weight.data)
    fresh = ClusTR('tiny', init_cfg=dict(type='Pretrained',
                                         checkpoint=str(dst),
                                         prefix='backbone.')).eval()
    fresh.init_weights()
    # the official file itself, by init_cfg: the loader converts it through
    # the same converter (one path, issue 41 item 4)
    direct = ClusTR('tiny', init_cfg=dict(type='Pretrained',
                                          checkpoint=str(src),
                                          prefix='backbone.')).eval()
    direct.init_weights()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for a, b, c in zip(model(x), fresh(x), direct(x)):
            assert torch.equal(a, b) and torch.equal(a, c)

    # The whole checkpoint is an mmpretrain classifier's state dict.
    mmpretrain_models = pytest.importorskip('mmpretrain.registry').MODELS
    classifier = mmpretrain_models.build(
        dict(type='ImageClassifier', backbone=dict(type='ClusTR', arch='tiny'),
             neck=dict(type='GlobalAveragePooling'),
             head=dict(type='LinearClsHead', num_classes=1000,
                       in_channels=512))).eval()
    classifier.load_state_dict(state, strict=True)
    with torch.no_grad():
        logits = classifier(x, mode='tensor')
        expected = head(model(x)[-1].mean((2, 3)))
    torch.testing.assert_close(logits, expected)


@pytest.mark.slow
def test_converter_reports_mismatches(tmp_path):
    official = to_official(ClusTR('tiny').state_dict())
    official.pop('norm4.weight')
    official['block1.0.attn.q.bias'] = torch.zeros(3)
    src = tmp_path / 'official.pth'

    def convert():
        torch.save(official, src)
        return subprocess.run(
            [sys.executable, str(REPO / 'tools/model_converters/'
                                 'clustr_official_to_mm.py'), str(src),
             str(tmp_path / 'out.pth'), '--arch', 'tiny'],
            capture_output=True, text=True, cwd=REPO)

    result = convert()
    assert result.returncode != 0
    assert 'backbone.stages.3.norm.weight' in result.stdout
    assert 'backbone.stages.0.blocks.0.attn.q.bias' in result.stdout
    assert not (tmp_path / 'out.pth').exists()
    official['relative_bias'] = torch.zeros(2)  # a key no rule maps
    result = convert()
    assert result.returncode != 0
    assert re.search(r'an official ClusTR ImageNet classifier file, '
                     r"but no rule of the conversion table maps its keys "
                     r"\['relative_bias'\]", result.stderr), result.stderr
    assert not (tmp_path / 'out.pth').exists()


def test_ffn_inference_path_equals_autograd_path():
    # The FFN activates in place when no gradient is needed; it must compute
    # exactly what the autograd path computes.
    torch.manual_seed(11)
    ffn = ConvFFN(16, 64)
    x = torch.randn(2, 20, 16)
    with_grad = ffn(x, (4, 5))
    assert with_grad.requires_grad
    with torch.no_grad():
        assert torch.equal(ffn(x, (4, 5)), with_grad.detach())


@pytest.mark.parametrize('mode', ['exact', 'window'])
def test_outputs_are_standard_nchw(mode):
    # Necks and heads assume contiguous NCHW: mmcv's CPU RoIAlign reads a
    # channels-last map as if it were NCHW, which kept Mask R-CNN's RoI head
    # from learning.
    from mmcv.ops import roi_align
    model = ClusTR('tiny', clustering_mode=mode).eval()
    with torch.no_grad():
        outs = model(torch.randn(2, 3, 64, 96))
    assert all(o.is_contiguous() for o in outs)
    rois = torch.tensor([[0, 2., 2., 12., 10.], [1, 0., 4., 20., 14.]])
    pooled = roi_align(outs[0], rois, (4, 4), 1.0, 2, 'avg', True)
    reference = roi_align(outs[0].clone(memory_format=torch.contiguous_format),
                          rois, (4, 4), 1.0, 2, 'avg', True)
    torch.testing.assert_close(pooled, reference)

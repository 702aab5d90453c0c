"""The analysis tools: FLOP counting against hand counts, get_flops on every
library, and cluster pictures whose colours follow the assignments."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn

import clustr_mm  # noqa: F401
from clustr_mm.env_check import installed_version
from clustr_mm.models.layers import ClusterAttention, PaCaAttention
from clustr_mm.analysis.flops import analyze_flops, dpc_knn_macs

from conftest import TORCH, load_tool, run_tool
from fused_cases import needs_triton

ROOT = Path(__file__).resolve().parents[1]


class OneBlock(nn.Module):
    """An attention layer under the name ``attn``, on a fixed token grid."""

    def __init__(self, attn, hw):
        super().__init__()
        self.attn, self.hw = attn, hw

    def forward(self, x):
        out = self.attn(x, self.hw)
        return out[0] if isinstance(out, tuple) else out


# --------------------------------------------------------------------------
# FLOP counts by hand


def test_cluster_attention_hand_count():
    """ClusTR attention, C=32, 2 heads, sr=4 on an 8x8 grid: N=64 tokens,
    DPC-kNN into m1 = 64 // 16 = 4 and m2 = 16 clusters (k = 5)."""
    torch.manual_seed(0)
    model = OneBlock(ClusterAttention(32, 2, sr_ratio=4), (8, 8)).eval()
    report = analyze_flops(model, torch.randn(1, 64, 32))
    ops = report.by_operator

    q = proj = 64 * 32 * 32            # N C C
    weight_layer = 64 * 32 * 1         # N C
    kv1, kv2 = 4 * 32 * 64, 16 * 32 * 64  # M_s C 2C
    assert ops['linear'] == q + weight_layer + kv1 + kv2 + proj
    # SDPA: heads * N * M * (d_k + d_v), d = 16, per scale
    sdpa = 2 * 64 * 4 * (16 + 16) + 2 * 64 * 16 * (16 + 16)
    assert ops['matmul'] == sdpa
    # DPC-kNN on one window of n = 64 tokens, K = 16 centres:
    distances = (64 * 64 + 64 * 16) * (32 + 2)
    selection = 2 * 64 * 64 + 64 * 5 + 2 * 64 + 64 * (4 + 16)
    merge = 2 * 64 * (32 + 1)
    assert ops['clustering.distances'] == distances == 174080
    assert ops['clustering.selection'] == selection == 9920
    assert ops['clustering.merge'] == merge
    clustering = distances + selection + merge
    assert report.total == (q + weight_layer + kv1 + kv2 + proj + sdpa +
                            clustering)
    # sorted into parts: the token-weight linear belongs to the clustering
    assert report.by_part['backbone/attention projections'] == (
        q + kv1 + kv2 + proj)
    assert report.by_part['backbone/attention products'] == sdpa
    assert report.by_part['backbone/clustering'] == clustering + weight_layer
    assert report.without_attention_and_clustering == q + kv1 + kv2 + proj


def test_paca_attention_hand_count():
    """PaCa attention with its conv clustering: C=32, 2 heads, M=8 clusters,
    8x8 grid (N=64)."""
    torch.manual_seed(0)
    model = OneBlock(PaCaAttention(32, 2, 8, 'conv'), (8, 8)).eval()
    report = analyze_flops(model, torch.randn(1, 64, 32))

    dwconv = 64 * 32 * 7 * 7           # depthwise 7x7: N C k^2
    pwconv = 64 * 32 * 32              # 1x1 C->C
    to_clusters = 64 * 32 * 8          # 1x1 C->M
    merge = 8 * 64 * 32                # A (M x N) @ X (N x C)
    cluster_norm = 8 * 32 * 5          # LayerNorm: 5 per element (mmengine)
    q = proj = 64 * 32 * 32
    k = v = 8 * 32 * 32                # from the M cluster tokens
    sdpa = 2 * 64 * 8 * (16 + 16)
    clustering = dwconv + pwconv + to_clusters + merge + cluster_norm
    assert report.by_part['backbone/clustering'] == clustering
    assert report.by_part['backbone/attention projections'] == q + k + v + proj
    assert report.by_part['backbone/attention products'] == sdpa
    assert report.by_operator['matmul'] == sdpa
    assert report.by_operator['bmm'] == merge
    assert report.total == clustering + q + k + v + proj + sdpa


def test_one_block_clustr_backbone_hand_count():
    """ClusTR with one block per stage at 64x64: grids 16x16, 8x8, 4x4, 2x2.
    Stage 3's fine scale (4 * 16 // 4 = 16 = n) is the identity: nothing is
    clustered for it; stage 4 is full attention."""
    from mmengine.registry import MODELS
    model = MODELS.build(dict(
        type='ClusTR', arch=dict(embed_dims=(64, 128, 256, 512),
                                 depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8),
                                 mlp_ratios=(8, 8, 4, 4)))).eval()
    report = analyze_flops(model, torch.rand(1, 3, 64, 64))
    ops = report.by_operator
    assert ops['clustering.distances'] == (
        (256 * 256 + 256 * 16) * 66 +      # stage 1: n=256, C=64, K=16
        (64 * 64 + 64 * 16) * 130 +        # stage 2: n=64, C=128, K=16
        (16 * 16 + 16 * 4) * 258)          # stage 3: n=16, C=256, K=4
    assert ops['clustering.selection'] == (
        (2 * 256**2 + 256 * 5 + 2 * 256 + 256 * 20) +
        (2 * 64**2 + 64 * 5 + 2 * 64 + 64 * 20) +
        (2 * 16**2 + 16 * 5 + 2 * 16 + 16 * 4))
    assert ops['clustering.merge'] == (2 * 256 * 65 + 2 * 64 * 129 +
                                       1 * 16 * 257)
    # SDPA: heads * N * (m1 + m2) * 2d; d = 64 in every stage
    assert ops['matmul'] == (
        1 * 256 * 20 * 128 + 2 * 64 * 20 * 128 + 4 * 16 * (4 + 16) * 128 +
        8 * 4 * 4 * 128)
    assert sum(report.by_part.values()) == report.total
    # the analytic count replaced the traced one: no distance bmm is left
    assert 'bmm' not in ops and 'topk' not in ops


def test_dpc_knn_count_window_mode_tiles_the_grid():
    """Window mode: a 10x7 grid in 4x4 windows = 2 full windows, 2 of 4x3
    (right edge), one 2x4 (bottom) and one 2x3 (corner); sr=2, one scale
    (m = n // 4 clusters per window), batch 2, C = 8."""
    reducer = type('R', (), dict(window_size=4, sr_ratio=2,
                                 scale_factors=(1, ), k=5))()
    counts = dpc_knn_macs(reducer, batch=2, channels=8, hw=(10, 7))
    windows = [(2, 16, 4), (2, 12, 3), (1, 8, 2), (1, 6, 1)]  # (#, n, m)
    assert counts['clustering.distances'] == sum(
        2 * g * (n * n + n * m) * 10 for g, n, m in windows)
    assert counts['clustering.selection'] == sum(
        2 * g * (2 * n * n + n * 5 + 2 * n + n * m) for g, n, m in windows)
    assert counts['clustering.merge'] == 2 * 70 * 9


# --------------------------------------------------------------------------
# get_flops on the four libraries


# (config, --shape, the input it counts: the shape, the config's crop (ADE20K)
# or codec input (pose), what the count says besides FLOPs)
@pytest.mark.parametrize('config,shape,counted_input,counted', [
    ('configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py', (128, 160),
     [128, 160], '1000 proposals'),
    ('configs/clustr/fpn_clustr-t_embedded-ade20k.py', None, [128, 128], ''),
    ('configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py', None,
     [64, 48], ''),
    ('configs/paca/retinanet_paca-s_fpn_1x_coco.py', (128, 128), [128, 128],
     ''),
])
def test_get_flops_libraries(config, shape, counted_input, counted):
    tool = load_tool('get_flops')
    r = tool.get_flops(str(ROOT / config), shape)
    assert r['flops'] > 0 and r['params'] > r['backbone_params'] > 0
    assert sum(r['by_part'].values()) == r['flops']
    assert {'neck', 'heads'} <= set(r['by_part'])
    assert r['by_part']['backbone/clustering'] > 0
    assert r['by_part']['backbone/attention products'] > 0
    assert r['input'][2:] == counted_input
    assert counted in r['counted']


@pytest.mark.slow
def test_get_flops_cli(tmp_path):
    out = tmp_path / 'flops.json'
    proc = run_tool(['tools/analysis/get_flops.py',
                     'configs/clustr/clustr-t_embedded-imagenet.py',
                     '--json', str(out)], timeout=300)
    assert 'FLOPs:' in proc.stdout and 'backbone: clustering' in proc.stdout
    r = json.loads(out.read_text())
    assert r['scope'] == 'mmpretrain' and r['input'] == [1, 3, 64, 64]
    assert r['flops'] > r['flops_without_attention_and_clustering'] > 0


# --------------------------------------------------------------------------
# Cluster pictures


def _cell_centres(panel):
    """Picture coordinates of the centre of every token cell of a panel."""
    x0, y0, x1, y1 = panel['box']
    h, w = panel['hw']
    ys = y0 + ((np.arange(h) + 0.5) * (y1 - y0) / h).astype(int)
    xs = x0 + ((np.arange(w) + 0.5) * (x1 - x0) / w).astype(int)
    return ys, xs


def _check_hard_panel(pixels, panel, ids):
    ys, xs = _cell_centres(panel)
    colours = pixels[ys][:, xs].reshape(-1, 3)
    ids = np.asarray(ids).reshape(-1)
    by_id = {}
    for i, c in zip(ids.tolist(), map(tuple, colours)):
        by_id.setdefault(i, set()).add(c)
    assert all(len(c) == 1 for c in by_id.values()), \
        'a cluster got several colours'
    per_id = [next(iter(c)) for c in by_id.values()]
    assert len(set(per_id)) == len(per_id), 'two clusters share a colour'
    # inside a token's cell, every pixel has the cell's colour
    x0, y0, x1, y1 = panel['box']
    cell = pixels[y0:y0 + (y1 - y0) // panel['hw'][0],
                  x0:x0 + (x1 - x0) // panel['hw'][1]].reshape(-1, 3)
    assert (cell == cell[0]).all()


def test_render_colours_follow_assignments(tmp_path):
    tool = load_tool('visualize_clusters')
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 9, (6, 8), generator=gen)
    ids[0, 0] = -1  # a token left out by its reducer
    soft = torch.rand(3, 6, 8, generator=gen).softmax(0)
    records = [dict(stage=0, block=0, hw=(6, 8), maps=[ids]),
               dict(stage=1, block=2, hw=(6, 8), maps=[soft])]
    image = Image.new('RGB', (80, 60), (10, 200, 30))
    picture, panels = tool.render(image, records, tile=96, num_heatmaps=3,
                                  title='test')
    path = tmp_path / 'clusters.png'
    picture.save(path)
    pixels = np.asarray(Image.open(path).convert('RGB'))

    kinds = [p['kind'] for p in panels]
    assert kinds == ['image', 'hard', 'image', 'hard', 'soft', 'soft',
                     'soft']
    _check_hard_panel(pixels, panels[1], ids)
    _check_hard_panel(pixels, panels[3], soft.argmax(0))  # PaCa's argmax
    # heat maps: brighter colour <=> larger weight (inferno LUT position)
    from matplotlib import colormaps
    lut = colormaps['inferno'](np.linspace(0, 1, 256))[:, :3] * 255
    for panel in panels[4:]:
        ys, xs = _cell_centres(panel)
        colours = pixels[ys][:, xs].reshape(-1, 3).astype(float)
        pos = np.abs(colours[:, None] - lut[None]).sum(-1).argmin(1)
        values = soft[panel['cluster']].numpy().reshape(-1)
        order = np.argsort(values, kind='stable')
        assert (np.diff(pos[order]) >= 0).all()
        assert pos[order[0]] == 0 and pos[order[-1]] == 255


def test_palette_distinct():
    tool = load_tool('visualize_clusters')
    palette = tool.cluster_palette(3000)
    assert len({tuple(c) for c in palette}) == 3000
    assert tuple(tool.UNASSIGNED) not in {tuple(c) for c in palette}


@pytest.mark.slow
@pytest.mark.parametrize('config,kind', [
    ('configs/clustr/clustr-t_embedded-imagenet.py', 'hard'),
    ('configs/paca/paca-t_8xb128_in1k.py', 'soft'),
])
def test_visualize_clusters_end_to_end(tiny_data, tmp_path, config, kind):
    tool = load_tool('visualize_clusters')
    image = sorted((tiny_data / 'imagenet' / 'val').glob('*.JPEG'))[0]
    out = tmp_path / 'vis.png'
    picture, panels, records = tool.main([
        str(image), str(ROOT / config), '--out', str(out), '--shape', '64',
        '64', '--tile', '64', '--blocks', '0', '-1'])
    assert out.is_file()
    pixels = np.asarray(Image.open(out).convert('RGB'))
    # rows: stages 1-3 (stage 4 is full attention), first and last block
    assert {(r['stage'], r['block']) for r in records} >= {(0, 0), (2, 0)}
    assert all(r['stage'] < 3 for r in records)
    hard = [p for p in panels if p['kind'] == 'hard']
    assert hard and (kind == 'hard') == (
        not any(p['kind'] == 'soft' for p in panels))
    for panel in hard:
        rec = next(r for r in records if (r['stage'], r['block']) == (
            panel['stage'], panel['block']))
        m = rec['maps'][panel['scale']]
        _check_hard_panel(pixels, panel, m if m.dim() == 2 else m.argmax(0))


# --------------------------------------------------------------------------
# CONFIG [CHECKPOINT], the mm tools' order, for get_flops and
# visualize_clusters

CLS_EMBEDDED = 'configs/clustr/clustr-t_embedded-imagenet.py'


@pytest.fixture
def cls_checkpoint(tmp_path):
    """A runner-style checkpoint (``meta`` + ``state_dict``) of the embedded
    classifier, with weights drawn from seed 1 (the tools' random
    initialisation uses seed 0, so loaded weights are told apart)."""
    tool = load_tool('visualize_clusters')
    torch.manual_seed(1)
    model, _ = tool.build_model(str(ROOT / CLS_EMBEDDED))
    state = model.state_dict()
    path = tmp_path / 'epoch_1.pth'
    torch.save(dict(meta=dict(epoch=1), state_dict=state), path)
    return path, state


def test_get_flops_loads_checkpoint(cls_checkpoint, tmp_path):
    tool = load_tool('get_flops')
    path, state = cls_checkpoint
    config = str(ROOT / CLS_EMBEDDED)
    bare = tool.get_flops(config)
    r = tool.get_flops(config, checkpoint=str(path))
    assert bare['checkpoint'] is None
    assert r['checkpoint'] == dict(path=str(path), into='model',
                                   loaded=len(state), tensors=len(state),
                                   reinitialized=[])
    # the counts do not depend on the weights
    assert r['flops'] == bare['flops'] and r['by_part'] == bare['by_part']
    assert 'weights: ' + str(path) in tool.format_result(r)

    # backbone-only weights go into the backbone
    backbone = {k[len('backbone.'):]: v for k, v in state.items()
                if k.startswith('backbone.')}
    torch.save(backbone, tmp_path / 'backbone.pth')
    r = tool.get_flops(config, checkpoint=str(tmp_path / 'backbone.pth'))
    assert r['checkpoint']['into'] == 'backbone'
    assert r['checkpoint']['loaded'] == r['checkpoint']['tensors'] == len(
        backbone)
    # weights of something else are refused, not silently ignored
    torch.save(dict(state_dict={'fc.weight': torch.zeros(2, 2)}),
               tmp_path / 'other.pth')
    with pytest.raises(RuntimeError, match='none of the'):
        tool.get_flops(config, checkpoint=str(tmp_path / 'other.pth'))


@pytest.mark.slow
def test_get_flops_cli_with_checkpoint(cls_checkpoint, tmp_path):
    path, state = cls_checkpoint
    out = tmp_path / 'flops.json'
    proc = run_tool(['tools/analysis/get_flops.py', CLS_EMBEDDED, str(path),
                     '--json', str(out)], timeout=300)
    assert (f'weights: {path} ({len(state)} of {len(state)} model tensors '
            'loaded)') in proc.stdout
    assert json.loads(out.read_text())['checkpoint']['loaded'] == len(state)


@pytest.mark.slow
def test_visualize_clusters_config_checkpoint_order(tiny_data, tmp_path,
                                                    cls_checkpoint):
    tool = load_tool('visualize_clusters')
    path, state = cls_checkpoint
    config = str(ROOT / CLS_EMBEDDED)
    image = str(sorted((tiny_data / 'imagenet' / 'val').glob('*.JPEG'))[0])
    common = ['--shape', '64', '64', '--tile', '64']

    model, _ = tool.build_model(config, str(path))
    own = model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in state.items())

    def maps(records):
        return [(r['stage'], r['block'], m) for r in records
                for m in r['maps']]

    def same(a, b):
        return len(a) == len(b) and all(
            x[:2] == y[:2] and torch.equal(x[2], y[2]) for x, y in zip(a, b))

    new = tool.main([config, str(path), '--image', image, '--out',
                     str(tmp_path / 'new.png'), *common])[2]
    old = tool.main([image, config, str(path), '--out',
                     str(tmp_path / 'old.png'), *common])[2]
    bare = tool.main([config, '--image', image, '--out',
                      str(tmp_path / 'bare.png'), *common])[2]
    assert maps(new) and same(maps(new), maps(old))
    assert (tmp_path / 'new.png').read_bytes() == (
        tmp_path / 'old.png').read_bytes()
    # the checkpoint's weights, not the random ones, made the clusters
    assert not same(maps(new), maps(bare))

    out = ['--out', str(tmp_path / 'x.png')]
    for bad in ([config, str(path), *out],               # no image
                [image, config, '--image', image, *out],  # two images
                [config, str(tmp_path / 'missing.pth'), '--image', image,
                 *out]):
        with pytest.raises(SystemExit):
            tool.parse_args(bad)


# --------------------------------------------------------------------------
# the benchmark tools: op census, throughput mode (device, amp, train
# step), traffic census, ONNX Runtime

BENCHMARK = 'tools/analysis/benchmark.py'


def test_op_census_counts_ops_and_syncs():
    from clustr_mm.analysis.op_census import op_census
    x = torch.randn(6, 4)
    mask = x[:, 0] > 0
    repeats = torch.tensor([1, 2, 0, 1, 1, 1])
    calls = []

    def fn():
        calls.append(1)
        y = (x * 2).t().contiguous()          # a view is not an op
        y.t()[mask]                           # boolean mask: sync
        y[:, repeats]                         # integer index: none
        float(y.sum())                        # _local_scalar_dense
        repeats.tolist()                      # host read of a CPU tensor
        torch.repeat_interleave(repeats)                 # sync
        torch.repeat_interleave(repeats, output_size=6)  # none

    census = op_census(fn, warmup=2)
    assert len(calls) == 3
    assert census['by_op'] == {'index': 2, 'repeat_interleave': 2, 'mul': 1,
                               'clone': 1, 'sum': 1,
                               '_local_scalar_dense': 1}
    assert census['ops'] == 8
    assert census['syncs_by_op'] == {'index': 1, '_local_scalar_dense': 1,
                                     'tolist': 1, 'repeat_interleave': 1}
    assert census['host_syncs'] == 4


@pytest.mark.slow
def test_benchmark_census(tmp_path):
    out = tmp_path / 'census.json'
    proc = run_tool(['tools/analysis/op_census.py', '--models',
                     'clustr-t-window',
                     'paca-t', '--sizes', '64', '--batch', '2', '--threads',
                     '1', '--out', str(out)], timeout=300)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith('device: cpu (') and 'batch 2' in lines[0]
    assert lines[1].startswith('command: python tools/analysis/op_census.py '
                               '--models')
    assert lines[2].split()[:5] == ['model', 'size', 'ops', 'launches',
                                    'host_syncs']
    rows = json.loads(out.read_text())
    assert [r['model'] for r in rows] == ['clustr-t-window', 'paca-t']
    for r in rows:
        assert type(r['ops']) is int and r['ops'] > 0
        assert type(r['host_syncs']) is int and r['host_syncs'] >= 0
        assert sum(r['by_op'].values()) == r['ops']
        assert r['batch'] == 2 and r['torch'] == torch.__version__
        assert r['driver'] is None and r['cuda'] == torch.version.cuda
        assert r['triton'] == installed_version('triton')
        assert 'latency_s' not in r  # a census is not timed
        line = next(x for x in lines if x.startswith(r['model']))
        top = max(r['by_op'], key=r['by_op'].get)
        assert line.split()[2:5] == [str(r['ops']), str(r['launches']),
                                     str(r['host_syncs'])]
        assert f'{top} {r["by_op"][top]}' in line
    # ClusTR's clustering is one op a call that launches several kernels
    # on a GPU (its CUDA path, counted inside); PaCa has no op of its own
    clustr, paca = rows
    per_call = clustr['launches_per_call']['dpc_knn_merge']
    assert per_call >= 10 and 'dpc_knn_merge ' + str(per_call) in lines[3]
    calls = clustr['by_op']['dpc_knn_merge']
    assert clustr['launches'] > clustr['ops'] + calls * (10 - 1) - 1
    assert paca['launches'] == paca['ops'] and not paca['launches_per_call']


@pytest.mark.slow
def test_host_time_runs_the_census_op_sequence_on_meta(tmp_path):
    """host_time.py times each model's forward on ``meta`` and reports the
    ops of that forward: they must be the CPU census's (the same code
    path, the fused clustering op once a call), every host time positive,
    and the ratios taken against pvtv2-b2 of the same run."""
    from clustr_mm.analysis.op_census import op_census
    common = load_tool('benchmark_common')
    torch.manual_seed(0)
    model = common.build('clustr-t-window')
    common.cuda_path(model)
    x = torch.randn(2, 3, 64, 64)
    census = op_census(lambda: model(x), warmup=1)
    out = tmp_path / 'host.json'
    proc = run_tool(['tools/analysis/host_time.py', '--models',
                     'clustr-t-window', 'pvtv2-b2', '--sizes', '64',
                     '--runs', '3', '--warmup', '1', '--threads', '1',
                     '--out', str(out)], timeout=300)
    lines = proc.stdout.splitlines()
    assert lines[2].split()[:5] == ['model', 'size', 'host_ms', 'cpp_ms',
                                    'ops']
    assert ('  host time relative to pvtv2-b2 at 64x64 (all; without '
            'Python meta kernels):') in lines
    rows = {r['model']: r for r in json.loads(out.read_text())}
    clustr, pvt = rows['clustr-t-window'], rows['pvtv2-b2']
    assert clustr['ops'] == census['ops']
    assert clustr['by_op'] == census['by_op']
    assert clustr['host_syncs'] == census['host_syncs']
    for r in rows.values():
        assert r['runtime'] == 'meta' and r['meta_kernels'] == 'c++'
        assert len(r['host_runs_ms']) == 3 and min(r['host_runs_ms']) > 0
        assert r['host_ms'] == pytest.approx(
            sorted(r['host_runs_ms'])[1])  # the median of 3
        assert 0 <= r['python_meta_ops'] < r['ops']
        # the Python meta kernels' time taken out: less, still positive
        assert 0 < r['host_ms_cpp'] < r['host_ms']
    assert pvt['host_vs_pvtv2_b2'] == 1 == pvt['cpp_vs_pvtv2_b2']
    assert clustr['host_vs_pvtv2_b2'] == pytest.approx(
        clustr['host_ms'] / pvt['host_ms'])


def test_host_time_meta_forward_is_host_work_only():
    """On ``meta`` a forward's cost does not grow with the input (no
    arithmetic), and a forward with twice the Python work and ops takes
    longer: what the tool's figure stands for."""
    tool = load_tool('host_time')
    block = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.LayerNorm(8))
    one, two = block.to('meta'), nn.Sequential(*block, *block).to('meta')
    small = torch.empty(1, 16, 8, device='meta')
    large = torch.empty(64, 4096, 8, device='meta')

    def best(model, x):
        import time
        times = []
        for _ in range(30):
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
        return min(times)

    with torch.no_grad():
        assert best(one, large) < 5 * best(one, small) + 1e-4
        assert best(two, small) > 1.2 * best(one, small)
    table = tool.HostTable(tool.parse_args([]))
    rows = [dict(model='clustr-s-window', size='800x1344', host_ms=60.0,
                 host_ms_cpp=30.0),
            dict(model='swin-t', size='800x1344', error='boom'),
            dict(model='pvtv2-b2', size='800x1344', host_ms=40.0,
                 host_ms_cpp=10.0)]
    assert table.ratios(rows)[1].split() == ['clustr-s-window', '1.50x,',
                                             '3.00x']
    assert table.ratios(rows[:2]) == []


@pytest.mark.slow
def test_benchmark_train_step_bf16_cpu(tmp_path):
    out = tmp_path / 'bench.json'
    proc = run_tool([BENCHMARK, '--device', 'cpu', '--amp', 'bf16',
                     '--train-step', '--runs', '1', '--models', 'paca-t',
                     '--sizes', '64', '--batch', '2', '--threads', '1',
                     '--out', str(out), '--plot', str(tmp_path / 'p.png')],
                    timeout=300)
    lines = proc.stdout.splitlines()
    assert (tmp_path / 'p.png').stat().st_size > 0
    assert 'amp bf16' in lines[0] and 'warm-up 1, runs 1' in lines[0]
    assert 'infer img/s' in lines[2] and 'train peak(MB)' in lines[2]
    (r, ) = json.loads(out.read_text())
    assert 'error' not in r, r
    assert r['device'] == 'cpu' and r['amp'] == 'bf16' and r['batch'] == 2
    assert len(r['latency_runs_s']) == len(r['train_runs_s']) == 1
    assert r['infer_img_s'] == pytest.approx(2 / r['latency_s'])
    assert r['train_img_s'] == pytest.approx(2 / r['train_step_s'])
    assert r['peak_forward_mem_mb'] >= 0 and r['peak_train_mem_mb'] > 0
    row = next(x for x in lines if x.startswith('paca-t')).split()
    assert row[2] == '2' and float(row[4]) > 0 and float(row[6]) > 0


@pytest.mark.slow
@pytest.mark.skipif(
    TORCH < (2, 4), reason='compile of the backbones is tested from torch 2.4 on '
    '(tests/test_graph_ready.py)')
def test_benchmark_compiled_model(tmp_path):
    """--compile times the compiled model: one whole graph, after a warm-up
    that takes the compilation."""
    out = tmp_path / 'bench.json'
    proc = run_tool([BENCHMARK, '--compile', 'default', '--runs', '1',
                     '--models', 'paca-t', '--sizes', '64', '--threads', '2',
                     '--out', str(out)], timeout=600)
    assert 'compile default' in proc.stdout.splitlines()[0]
    (r, ) = json.loads(out.read_text())
    assert 'error' not in r, r
    assert r['compile'] == 'default' and r['warmup'] == 3, r
    assert r['compiled_graphs'] == 1, r
    assert r['latency_s'] > 0


@pytest.mark.slow
def test_benchmark_compile_refuses_eager_only_modes():
    proc = run_tool([BENCHMARK, '--compile', 'default', '--flops'],
                    check=False)
    assert proc.returncode != 0 and '--flops need the eager one' in proc.stdout


@pytest.mark.parametrize('option,tool', [
    ('--census', 'op_census.py'), ('--traffic', 'traffic_census.py'),
    ('--scale-batch=8', 'traffic_census.py'),
    ('--runtime', 'onnxruntime_speed.py')])
def test_benchmark_names_the_tool_a_moved_job_went_to(option, tool, capsys):
    with pytest.raises(SystemExit) as exit_:
        load_tool('benchmark').parse_args(['--sizes', '64', option])
    assert f'is now its own tool: tools/analysis/{tool}' in str(exit_.value)


def test_benchmark_tools_keep_their_documented_defaults():
    """What each tool runs without options: benchmark.py the median of 5
    runs after 1 warm-up on the CPU, in the model's tf32x3; the censuses
    one counted call; ONNX Runtime timing 5 runs (a tool's own option
    default must not be replaced by the shared parser's)."""
    bench = load_tool('benchmark').parse_args([])
    assert (bench.runs, bench.warmup, bench.precision, bench.device,
            bench.amp) == (5, 1, 'tf32x3', 'cpu', 'none')
    common = load_tool('benchmark_common')
    census = common.parse_common(common.parser_for('x', timed=False), [])
    assert (census.runs, census.warmup, census.precision) == (1, 1, 'tf32x3')
    ort = load_tool('onnxruntime_speed').parse_args([])
    assert (ort.runs, ort.warmup, ort.precision, ort.device, ort.amp) == (
        5, 1, 'ieee', 'cpu', 'none')


def test_benchmark_ratios_to_pvtv2():
    tool = load_tool('benchmark')
    table = tool.SpeedTable(tool.parse_args(['--train-step']))
    rows = [dict(model='paca-s', size='224x224', infer_img_s=40.0,
                 train_img_s=10.0),
            dict(model='swin-t', size='224x224', error='boom'),
            dict(model='pvtv2-b2', size='224x224', infer_img_s=100.0,
                 train_img_s=40.0)]
    lines = table.ratios(rows)
    assert lines[0] == '  img/s relative to pvtv2-b2 at 224x224:'
    assert lines[1].split() == ['paca-s', 'infer', '0.40x', 'train', '0.25x']
    assert len(lines) == 2
    assert rows[0]['infer_vs_pvtv2_b2'] == pytest.approx(0.4)
    assert rows[0]['train_vs_pvtv2_b2'] == pytest.approx(0.25)
    # no reference in the run, or the latency table: no ratios
    assert table.ratios(rows[:2]) == []
    assert tool.SpeedTable(tool.parse_args([])).ratios(rows) == []


def test_benchmark_profile_lists_the_ops_that_take_the_time():
    """--profile: one forward's ops by self time, largest first, printed
    under the row (the CUDA kernels on a GPU; aten ops here)."""
    tool = load_tool('benchmark')
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU())
    x = torch.randn(64, 256)
    prof = tool.profile_top(lambda: model(x), lambda: None, 'cpu', rows=3)
    names = [e['name'] for e in prof['top']]
    assert 'aten::addmm' in names and len(names) <= 3, names
    ms = [e['ms'] for e in prof['top']]
    assert ms == sorted(ms, reverse=True) and ms[0] > 0
    assert prof['total_ms'] >= sum(ms)
    line = tool.SpeedTable(tool.parse_args(['--profile'])).row(dict(
        model='paca-t', size='64x64', params_m=1.0, latency_s=0.1,
        peak_forward_mem_mb=5.0, profile=prof))
    assert 'profile:' in line and 'aten::addmm' in line, line
    with pytest.raises(SystemExit):
        tool.parse_args(['--compile', 'default', '--profile'])


def test_profile_times_each_stage_and_its_parts():
    """--profile with the model: a range per stage (its own module, or a
    ModuleList its owner walks as mmdet's PVTv2 does) and per clustering,
    attention and MLP module inside it, timed inclusively; the ranges stay
    out of the op table and their hooks are removed afterwards."""
    import time

    from clustr_mm.registry import MODELS
    tool = load_tool('forward_profile')
    model = MODELS.build(dict(type='ClusTR', arch='tiny')).eval()
    x = torch.randn(1, 3, 64, 64)
    wall = []

    def forward():
        start = time.perf_counter()
        model(x)
        wall.append(1e3 * (time.perf_counter() - start))
    prof = tool.profile_top(forward, lambda: None, 'cpu', model=model)
    ranges = prof['ranges']
    depths = [len(stage.blocks) for stage in model.stages]
    assert [ranges[f'stage{i}']['calls'] for i in (1, 2, 3, 4)] == [1] * 4
    for i, depth in enumerate(depths, 1):
        stage = ranges[f'stage{i}']['ms']
        parts = {k.split('.')[1]: v for k, v in ranges.items()
                 if k.startswith(f'stage{i}.')}
        assert parts['attention']['calls'] == parts['mlp']['calls'] == depth
        assert 0 < parts['attention']['ms'] < stage, (i, ranges)
        if 'clustering' in parts:  # ClusTR's last stage attends to all
            assert 0 < parts['clustering']['ms'] < parts['attention']['ms']
    assert 'clustering' in {k.split('.')[-1] for k in ranges}
    assert sum(ranges[f'stage{i}']['ms'] for i in (1, 2, 3, 4)) < wall[0]
    assert not {e['name'] for e in prof['top']} & set(ranges)
    assert 'stage3: ' in tool.stage_lines(ranges)
    model(x)  # the hooks are gone: no range left open, nothing appended
    assert not any(m._forward_pre_hooks for m in model.modules())

    class Walked(nn.Module):  # stages as lists its forward walks
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.ModuleList([
                nn.Linear(4, 4), nn.ModuleList([nn.Linear(4, 4)]),
                nn.LayerNorm(4)])])
            self.layers[0][1][0].ffn = nn.Identity()

        def forward(self, x):
            embed, blocks, norm = self.layers[0]
            x = embed(x)
            for block in blocks:
                x = block.ffn(block(x))
            return norm(x)
    walked = Walked()
    prof = tool.profile_top(lambda: walked(torch.randn(2, 4)), lambda: None,
                            'cpu', model=walked)
    assert prof['ranges']['stage1']['calls'] == 1
    assert prof['ranges']['stage1.mlp']['calls'] == 1


def test_profile_lists_each_kernel_once_on_a_gpu():
    """On a GPU the op table lists the kernels only: the CPU op that
    launched a kernel carries the kernel's time as its own self device
    time, so listing both counted every kernel twice (the 2026-11-27 H200
    profile's totals); user annotations (the stage ranges' device side)
    are left out too. Stage ranges are timed from their CPU-side events."""
    from types import SimpleNamespace as Event

    from torch.autograd import DeviceType
    tool = load_tool('forward_profile')
    cpu, gpu = DeviceType.CPU, DeviceType.CUDA

    def avg(key, device, self_dev_us, self_cpu_us=0, note=False):
        return Event(key=key, name=key, count=2, device_type=device,
                     self_device_time_total=self_dev_us,
                     device_time_total=self_dev_us,
                     self_cpu_time_total=self_cpu_us,
                     cpu_time_total=self_cpu_us, is_user_annotation=note)
    events = [avg('aten::mm', cpu, 5000, 300), avg('gemm_kernel', gpu, 5000),
              avg('aten::add', cpu, 1000, 200), avg('add_kernel', gpu, 1000),
              avg('stage1', gpu, 7000, note=True),
              avg('stage1.mlp', gpu, 6000), avg('stage1', cpu, 6000, 900)]
    ranges = {'stage1', 'stage1.mlp'}
    got = tool.top_ops(events, 'cuda', ranges, rows=5)
    assert [e['name'] for e in got['top']] == ['gemm_kernel', 'add_kernel']
    assert got['total_ms'] == pytest.approx(6.0)
    got = tool.top_ops(events, 'cpu', ranges, rows=5)
    assert [e['name'] for e in got['top']] == ['aten::mm', 'aten::add']
    assert got['total_ms'] == pytest.approx(0.5)
    assert tool.range_totals(events, 'cuda', ranges) == {
        'stage1': dict(ms=6.0, calls=1)}
    assert tool.range_totals(events, 'cpu', ranges) == {
        'stage1': dict(ms=0.9, calls=1)}


def test_rows_name_the_gpu_driver(monkeypatch):
    """A GPU row carries the driver nvidia-smi reports, asked once a
    process; where nvidia-smi is missing or fails, None rather than a guess;
    no query off a GPU."""
    import subprocess
    provenance = load_tool('provenance')
    asked = []

    def smi(cmd, **kwargs):
        asked.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout='580.159.04\n')
    monkeypatch.setattr(subprocess, 'run', smi)
    assert provenance.software('cuda')['driver'] == '580.159.04'
    assert asked[0][0] == 'nvidia-smi'
    assert provenance.software('cpu')['driver'] is None and len(asked) == 1
    provenance.software('cuda')  # asked once a process
    assert len(asked) == 1

    def missing(cmd, **kwargs):
        raise FileNotFoundError(cmd[0])
    monkeypatch.setattr(subprocess, 'run', missing)
    provenance.driver_version.cache_clear()
    assert provenance.software('cuda')['driver'] is None


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason='a GPU is present')
def test_benchmark_cuda_without_gpu_fails_clearly():
    proc = run_tool([BENCHMARK, '--device', 'cuda', '--models', 'paca-t',
                     '--sizes', '64'], timeout=120, check=False)
    assert proc.returncode != 0
    assert 'torch.cuda.is_available() is False' in proc.stdout
    assert 'RESULT' not in proc.stdout and 'Traceback' not in proc.stdout


@pytest.mark.slow
def test_benchmark_fp16_on_cpu_fails_clearly():
    proc = run_tool([BENCHMARK, '--amp', 'fp16', '--device', 'cpu',
                     '--models', 'paca-t', '--sizes', '64'], timeout=120,
                    check=False)
    assert proc.returncode != 0
    assert '--amp fp16 needs --device cuda' in proc.stdout
    assert 'Traceback' not in proc.stdout


# --------------------------------------------------------------------------
# tools/analysis/train_speed.py
def _train_speed(args, tmp_path, check=True):
    return run_tool(['tools/analysis/train_speed.py', *args, '--work-dir',
                     str(tmp_path)], check=check)


@pytest.mark.slow
def test_train_speed_times_the_asked_input_size(tiny_data, tmp_path):
    """Every image reaches the model at exactly --input-size (the embedded
    COCO images are smaller and of other shapes), --batch per iteration,
    --iters timed iterations after --warmup."""
    out = tmp_path / 'speed.json'
    proc = _train_speed(['configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py',
                         '--input-size', '320x256', '--batch', '2',
                         '--iters', '2', '--warmup', '1', '--out', str(out)],
                        tmp_path)
    line = [ln for ln in proc.stdout.splitlines()
            if ln.startswith('[train-speed] {')]
    result = json.loads(line[-1].split(' ', 1)[1])
    assert result == json.loads(out.read_text())
    assert result['image_shape'] == [256, 320], result
    assert result['batch'] == 2 and result['iters'] == 2, result
    assert len(result['s_per_iter_all']) == 2
    assert min(result['s_per_iter_all']) <= result['s_per_iter'] <= max(
        result['s_per_iter_all'])
    assert result['peak_mem_mb'] > 0
    assert result['driver'] is None and result['cuda'] == torch.version.cuda


def test_train_speed_fixes_the_size_of_a_multi_scale_crop_pipeline():
    """The PaCa ms-1x configs pick between multi-scale resizes and a
    resize-crop-resize branch (``RandomChoice``): the whole choice becomes
    the one fixed Resize (it was refused on the GPU, 2026-11-26)."""
    from conftest import load_config
    speed = load_tool('train_speed')
    cfg = load_config('configs/paca/mask-rcnn_paca-s_fpn_ms-1x_coco.py')
    dataset = cfg.train_dataloader.dataset
    assert speed.fix_input_size(dataset, (1333, 800)) == 1
    types = [t['type'] for t in dataset.pipeline]
    assert 'RandomChoice' not in types and 'RandomCrop' not in str(dataset)
    resize = dataset.pipeline[types.index('Resize')]
    assert resize == dict(type='Resize', scale=(1333, 800), keep_ratio=False)
    assert not speed.has_resize(dict(type='RandomChoice', transforms=[[dict(
        type='RandomFlip')]]))


def test_train_speed_gpu_peak_survives_the_loggers_resets(monkeypatch):
    """MMEngine's log processor reads and resets CUDA's peak statistics
    each time it logs (``get_max_cuda_memory``); reading the peak once after
    the run gave 625 MB for a Mask R-CNN step that peaked at 11 GB (H200,
    2026-11-26). The timer keeps the largest peak of the timed iterations."""
    speed = load_tool('train_speed')
    peak = {'now': 0}
    monkeypatch.setattr(speed.torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(speed.torch.cuda, 'synchronize', lambda: None)
    monkeypatch.setattr(speed.torch.cuda, 'reset_peak_memory_stats',
                        lambda: peak.update(now=0))
    monkeypatch.setattr(speed.torch.cuda, 'max_memory_allocated',
                        lambda: peak['now'])
    timer = speed.StepTimer(warmup=1)

    class Runner:
        iter = 0

    usage_mib = [900, 300, 700, 200]  # the first is warm-up
    for i, mib in enumerate(usage_mib):
        Runner.iter = i
        timer.before_train_iter(Runner, i)
        peak['now'] = max(peak['now'], mib * 2**20)
        timer.after_train_iter(Runner, i)
        speed.torch.cuda.reset_peak_memory_stats()  # the LoggerHook's read
    assert timer.peak_mb() == 700
    assert len(timer.times) == 4


@pytest.mark.slow
def test_train_speed_clear_errors(tmp_path):
    bad = _train_speed(['configs/clustr/clustr-t_embedded-imagenet.py',
                        '--input-size', '224'], tmp_path, check=False)
    assert bad.returncode != 0 and '--input-size takes WxH' in bad.stdout
    # mmpretrain crops instead of resizing: nothing to set, said so
    none = _train_speed(['configs/clustr/clustr-t_embedded-imagenet.py',
                         '--input-size', '224x224'], tmp_path, check=False)
    assert none.returncode != 0
    assert 'cannot be set' in none.stdout, none.stdout[-2000:]


def test_train_speed_knows_every_release_schedule():
    """Every config that reproduces a release maps to its recipe and the
    official schedule's iterations (ImageNet: 300 epochs of 1,251 full
    batches of 1024, the last partial batch dropped as timm and DeiT do;
    COCO: 12 epochs of 7,330; ADE20K: 160k); the hours are the iterations
    at the median time, given only when measured as the recipe trains."""
    speed = load_tool('train_speed')
    table = speed.read_recipes()
    iterations = {'paca-imagenet': 375300, 'clustr-imagenet': 375300,
                  'paca-mask-rcnn-ms-1x': 87960, 'paca-upernet-160k': 160000,
                  'paca-head-160k': 160000}
    assert sorted(table['recipes']) == sorted(iterations)
    for config, entry in table['configs'].items():
        assert speed.recipe_for(config) == entry['recipe'], config
        assert speed.schedule_iterations(
            table['recipes'][entry['recipe']]) == iterations[entry['recipe']]
    for config in ('configs/clustr/clustr-t_embedded-imagenet.py',
                   'mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py'):
        assert speed.recipe_for(config) is None
        assert speed.release_estimate({}, None, True) == dict(recipe=None)
    upernet = 'configs/paca/upernet_paca-t_8xb2-160k_ade20k-512x512.py'
    as_trained = speed.release_estimate(
        dict(batch=2, s_per_iter=0.45), speed.recipe_for(upernet), True)
    assert as_trained == dict(
        recipe='paca-upernet-160k', recipe_gpus=8, recipe_iterations=160000,
        expected_hours=20.0, expected_hours_not_given=None)
    other = speed.release_estimate(dict(batch=4, s_per_iter=0.45),
                                   'paca-upernet-160k', False)
    assert other['expected_hours'] is None
    assert other['expected_hours_not_given'] == (
        "batch 4, the recipe's is 2 per GPU; precision: the recipe trains "
        'with amp, this run without --amp')


def test_train_speed_goes_on_after_a_failed_config(monkeypatch, tmp_path,
                                                   capsys):
    """A config that fails (out of memory, say) is named and the next is
    still measured; the exit status says one failed."""
    speed = load_tool('train_speed')
    first, second = ('configs/clustr/clustr-t_embedded-imagenet.py',
                     'configs/paca/paca-t_embedded-imagenet.py')

    def measure(config, cfg, args):
        if config == first:
            raise RuntimeError('CUDA out of memory (planted)')
        assert cfg.model.backbone.init_cfg is None
        return dict(config=config, device='cpu', amp=False, batch=8,
                    image_shape=[64, 64], s_per_iter=0.25, peak_mem_mb=9.0,
                    recipe=None)

    monkeypatch.setattr(speed, 'measure', measure)
    out = tmp_path / 'rows.jsonl'
    out.write_text('an earlier run\n')
    assert speed.main([first, second, '--out', str(out)]) == 1
    printed = capsys.readouterr()
    assert f'[train-speed] FAILED {first}' in printed.out
    assert 'CUDA out of memory (planted)' in printed.err
    assert '1 of 2 configs failed' in printed.out
    assert [json.loads(ln)['config'] for ln in
            out.read_text().splitlines()] == [second]
    assert '| paca-t_embedded-imagenet.py | cpu | no | 8 | 64x64 | 0.2500 |' \
        in printed.out
    # --release: the named configs, then every release one, each once
    from mmengine.config import Config
    measured = []
    monkeypatch.setattr(speed, 'load', lambda config: Config(dict(
        model=dict(backbone=dict()), train_dataloader=dict(dataset={}))))
    monkeypatch.setattr(speed, 'measure', lambda config, cfg, args: (
        measured.append(config) or dict(
            config=config, device='cpu', amp=False, batch=2,
            image_shape=None, s_per_iter=1.0, peak_mem_mb=1.0,
            recipe=None)))
    table = speed.read_recipes()['configs']
    release = list(table)
    assert speed.main([second, release[3], '--release']) == 0
    assert measured == [second, release[3]] + release[:3] + release[4:]
    measured.clear()
    assert speed.main(['--release', 'paca-head-160k']) == 0
    assert measured == [c for c in release
                        if table[c]['recipe'] == 'paca-head-160k']
    assert len(measured) == 12
    capsys.readouterr()
    for argv, error in (([], 'name a CONFIG, or --release'),
                        (['--release', 'paca-retinanet'],
                         '--release: no recipe paca-retinanet')):
        with pytest.raises(SystemExit):
            speed.main(argv)
        assert error in capsys.readouterr().err
    if not torch.cuda.is_available():  # refused while reading, not trained
        monkeypatch.undo()
        pose = 'configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py'
        with pytest.raises(SystemExit, match=f'{pose}: --amp on the CPU .* '
                           'cannot train an mmpose config'):
            speed.main([first, pose, '--amp'])


@pytest.mark.slow
def test_train_speed_fills_the_batch_with_repeat(tiny_data, tmp_path):
    """The embedded ImageNet has 32 training images: a batch of 40 needs
    --repeat (without it the short batch is an error that says so, not a
    timing of 32 images); several configs run in one process, each a JSON
    row in --out and a line of the table."""
    configs = ['configs/clustr/clustr-t_embedded-imagenet.py',
               'configs/paca/paca-t_embedded-imagenet.py']
    short = _train_speed([configs[0], '--batch', '40', '--iters', '1',
                          '--warmup', '1'], tmp_path, check=False)
    assert short.returncode == 1, short.stdout[-2000:]
    assert '32 images, not the batch of 40' in short.stdout
    assert '--repeat N' in short.stdout
    assert '[train-speed] {' not in short.stdout
    out = tmp_path / 'rows.jsonl'
    proc = _train_speed([*configs, '--batch', '40', '--repeat', '3',
                         '--iters', '1', '--warmup', '1', '--out', str(out)],
                        tmp_path)
    rows = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert [r['config'] for r in rows] == configs
    assert all(r['batch'] == 40 and r['image_shape'] == [64, 64]
               and r['recipe'] is None for r in rows), rows
    for config in configs:
        assert f'| {config.split("/")[-1]} | cpu | no | 40 | 64x64 |' \
            in proc.stdout


# --------------------------------------------------------------------------
# Traffic census


def test_traffic_census_counts_bytes_flops_and_bound():
    from clustr_mm.analysis import traffic
    lin = nn.Linear(64, 32)
    x = torch.randn(8, 64)

    def fn():
        with torch.no_grad():
            return lin(x).relu()

    static = list(lin.parameters())
    r = traffic.traffic_census(fn, static=static)
    assert r['ops'] == 2  # addmm, relu (the weight's transpose is a view)
    addmm, relu = (next(o for o in r['top_ops'] if o['op'] == name)
                   for name in ('addmm', 'relu'))
    read = 4 * (8 * 64 + 64 * 32 + 32)
    assert addmm['bytes'] == read + 4 * 8 * 32
    assert addmm['flops'] == 2 * 8 * 64 * 32
    assert relu['bytes'] == 2 * 4 * 8 * 32 and relu['flops'] == 0
    assert r['bytes'] == addmm['bytes'] + relu['bytes']
    assert r['bytes_read'] == read + 4 * 8 * 32
    assert r['time_bound_s'] == pytest.approx(2 * traffic.LAUNCH_S)
    # batch 8 -> 800: the weight and bias are read once, the rest 100x
    big = traffic.traffic_census(fn, static=static, scale=100)
    assert big['ops'] == 2
    assert big['bytes'] == pytest.approx(
        4 * (64 * 32 + 32) + 100 * (r['bytes'] - 4 * (64 * 32 + 32)))
    assert big['flops'] == 100 * r['flops']
    assert traffic.time_bound(3e12, 0, False) == pytest.approx(1.0)
    assert traffic.time_bound(0, 600e12, True) == pytest.approx(1.0)
    assert traffic.time_bound(0, 50e12, False) == pytest.approx(1.0)
    assert traffic.time_bound(0, 165e12, False, True) == pytest.approx(1.0)


@pytest.mark.parametrize('groups,transposed', [(1, False), (32, False),
                                               (32, True), (4, True)])
def test_traffic_census_counts_convolution_gradients_as_the_forward(
        groups, transposed):
    """Each gradient of a convolution (input, weight) costs its forward's
    FLOPs, grouped or not, transposed or not; torch.utils.flop_counter
    counted a depthwise weight gradient ``groups`` times over (ClusTR-S's
    800x1344 training step: 10.5 TFLOP, mostly that)."""
    from clustr_mm.analysis import traffic
    conv = (nn.ConvTranspose2d if transposed else nn.Conv2d)(
        32, 64, 3, stride=2, padding=1, groups=groups)
    x = torch.randn(2, 32, 12, 10, requires_grad=True)

    def fn():
        conv(x).square().sum().backward()

    ops = {o['op']: o['flops']
           for o in traffic.traffic_census(fn)['top_ops']}
    forward = ops['convolution']
    side = x if transposed else conv(x)  # the smaller side
    assert forward == 2 * side.numel() * conv.weight[0].numel()
    assert ops['convolution_backward'] == 2 * forward


def test_traffic_census_sees_the_fused_clustering_as_one_op():
    if not hasattr(torch.library, 'custom_op'):
        pytest.skip('torch.library.custom_op is torch >= 2.4')
    from clustr_mm.analysis.traffic import (TrafficCensus, time_bound,
                                            traffic_census)
    from clustr_mm.ops.dpc_knn import FUSED_PLAN, WindowLayout, assign_clusters
    from clustr_mm.ops.dpc_knn.fused import dpc_knn_flops
    layout = WindowLayout((12, 12), None, 2, plan=FUSED_PLAN)
    x = torch.randn(2, 144, 8)
    r = traffic_census(lambda: assign_clusters(x, layout))
    (op, ) = [o for o in r['top_ops'] if o['op'] == 'clustr_mm::dpc_knn']
    assert op['count'] == 1
    # reads the (2, 144, 8) fp32 tokens, writes (1, 2, 144) long ids
    assert op['bytes'] == 4 * 2 * 144 * 8 + 8 * 2 * 144
    assert op['flops'] == dpc_knn_flops(2, 144, 8, 36)
    # in 'tf32x3' precision the same op, its FLOPs at the 3xTF32 peak
    census = TrafficCensus()
    fast = WindowLayout((12, 12), None, 2,
                        plan=FUSED_PLAN._replace(precision='tf32x3'))
    with census:
        assign_clusters(x, fast)
        assign_clusters(x, layout)
    tf32x3, ieee = [r['tf32x3'] for r in census.records
                    if r['op'] == 'clustr_mm::dpc_knn']
    assert tf32x3 and not ieee
    assert time_bound(0, op['flops'] * 1e6, False, True) == pytest.approx(
        time_bound(0, op['flops'] * 1e6, False) * 50 / 165)


@pytest.mark.slow
def test_benchmark_traffic(tmp_path):
    out = tmp_path / 'traffic.json'
    proc = run_tool(['tools/analysis/traffic_census.py', '--amp', 'bf16',
                     '--models',
                     'clustr-t-window', 'swin-t', '--sizes', '64', '--batch',
                     '2', '--scale-batch', '8', '--threads', '1',
                     '--precision', 'tf32x3', '--out', str(out)],
                    timeout=300)
    lines = proc.stdout.splitlines()
    assert lines[2].split()[:6] == ['model', 'size', 'ops', 'GB', 'GFLOP',
                                    'bound']
    rows = json.loads(out.read_text())
    assert [r['model'] for r in rows] == ['clustr-t-window', 'swin-t']
    clustr, swin = rows
    for r in rows:
        assert 'error' not in r, r
        assert r['scale_batch'] == 8 and len(r['top_ops']) == 10
        assert r['bytes'] == pytest.approx(r['bytes_read'] +
                                           r['bytes_written'])
        assert r['time_bound_s'] >= r['ops'] * 2.5e-6 * (1 - 1e-9)
    # the precision that applied: the counted fused op's, none for Swin-T
    assert clustr['precision'] == 'tf32x3' and swin['precision'] is None
    # the clustering (and merge) is the fused op, once per clustering block
    assert clustr['op_counts']['clustr_mm::dpc_knn_merge'] == 9
    assert 'topk' not in clustr['op_counts']
    assert clustr['bytes_vs_swin_t'] == pytest.approx(
        clustr['bytes'] / swin['bytes'])
    assert any(ln.strip().startswith('clustr-t-window  bytes')
               for ln in lines)
    bad = run_tool(['tools/analysis/traffic_census.py', '--scale-batch',
                    '0'], check=False)
    assert bad.returncode != 0 and '--scale-batch' in bad.stdout


@pytest.mark.slow
def test_precision_check_tool(tmp_path):
    """The 3xTF32 id check runs ClusTR and reports every clustered stage;
    on small random inputs the ids agree (at most one may move per stage)."""
    out = tmp_path / 'precision.json'
    proc = run_tool(['tools/analysis/precision_check.py', '--arch', 'tiny',
                     '--size', '64', '--images', '1', '--data',
                     str(tmp_path), '--out', str(out)], timeout=300)
    assert 'random inputs' in proc.stdout
    result = json.loads(out.read_text())
    rows = result['stages']
    assert [r['stage'] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r['calls'] >= 1 and r['ids'] > 0
        # measured 0.000 % in every stage for both (2026-11-26, torch
        # 2.14.1, 2-core CPU; 512 / 256 / 96 ids): at most one id may move
        for key in ('tf32x3_pct', 'fp32_reordered_pct'):
            assert 0 <= r[key] * r['ids'] / 100 <= 1, (key, r)
    bad = run_tool(['tools/analysis/precision_check.py', '--images', '0'],
                   check=False)
    assert bad.returncode != 0 and '--images' in bad.stdout


# --------------------------------------------------------------------------
# onnxruntime_speed.py: the exported backbone against eager


def test_onnxruntime_speed_against_eager():
    """One (model, size) in-process: eager and ONNX Runtime timed on the
    same input, their outputs agree, the session has the asked threads, and
    the table prints the row."""
    tool = load_tool('onnxruntime_speed')
    threads = torch.get_num_threads()  # measure() sets it for the process
    args = tool.parse_args(['--models', 'paca-t', '--sizes', '64', '--runs',
                            '1', '--threads', str(threads)])
    r = tool.measure('paca-t', (64, 64), args)
    assert len(r['latency_runs_s']) == len(r['ort_runs_s']) == 1
    assert r['latency_s'] > 0 and r['ort_latency_s'] > 0
    assert r['ort_vs_eager'] == pytest.approx(r['ort_latency_s'] /
                                              r['latency_s'])
    assert r['ort_intra_op_threads'] == threads
    assert r['ort_inter_op_threads'] == 1
    assert r['ort_export_s'] > 0 and r['onnx_file_mb'] > 10  # 11.8 M fp32
    # the graph computes the backbone: round-off only (3.5e-6 measured)
    assert r['max_abs_eager'] > 0.1
    assert 0 <= r['ort_max_abs_diff'] <= 1e-4
    info = tool.info_of(args, ['onnxruntime_speed.py'])
    assert info['runtime'] == 'onnxruntime' and info['device'] == 'cpu'
    assert info['onnxruntime'] and info['onnx']
    table = tool.RuntimeTable(args)
    assert table.header().split() == ['model', 'size', 'params(M)',
                                      'eager(ms)', 'ORT(ms)', 'ORT/eager',
                                      'max|diff|', 'export(s)']
    row = table.row(r).split()
    assert row[:2] == ['paca-t', '64x64']
    assert float(row[3]) == pytest.approx(r['latency_s'] * 1e3, abs=0.06)
    assert float(row[4]) == pytest.approx(r['ort_latency_s'] * 1e3, abs=0.06)


@pytest.mark.parametrize('option', [
    ['--device', 'cuda'], ['--train-step'], ['--compile', 'default'],
    ['--amp', 'bf16'], ['--precision', 'tf32x3'], ['--plot', 'x.png']])
def test_onnxruntime_speed_has_no_option_it_cannot_time(option, capsys):
    """CPU fp32 eval forwards only: any other option is refused by name."""
    tool = load_tool('onnxruntime_speed')
    with pytest.raises(SystemExit):
        tool.parse_args(option)
    assert f'unrecognized arguments: {option[0]}' in capsys.readouterr().err


def test_onnxruntime_speed_needs_the_package(monkeypatch, capsys):
    tool = load_tool('onnxruntime_speed')
    monkeypatch.setitem(sys.modules, 'onnxruntime', None)
    with pytest.raises(SystemExit):
        tool.parse_args([])
    assert ('this tool needs onnxruntime, not installed: pip install -r '
            'requirements/onnx.txt' in capsys.readouterr().err)
    load_tool('benchmark').parse_args([])  # eager needs no onnxruntime


def test_results_saved_before_the_split_still_plot(tmp_path):
    """Rows written by benchmark.py when it had every job as a mode (the
    H200 table of 2026-11-27) plot with today's plot_benchmark."""
    saved = ROOT / 'docs/results/2026-11-27_h200_bench-224_tf32x3.json'
    rows = json.loads(saved.read_text())
    exps = load_tool('plot_benchmark').plot(rows, str(tmp_path / 'p.png'))
    assert set(exps) == {r['model'] for r in rows}
    assert (tmp_path / 'p.png').stat().st_size > 0


def test_benchmark_child_past_its_timeout_is_a_failed_row(monkeypatch):
    """A (model, size) that runs past --timeout fails its row; the run goes
    on with the next one (before: TimeoutExpired ended the whole run)."""
    tool = load_tool('benchmark')
    common = load_tool('benchmark_common')

    def too_slow(cmd, timeout, **kwargs):
        raise common.subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(common.subprocess, 'run', too_slow)
    args = tool.parse_args(['--timeout', '5'])
    assert common.run_child(BENCHMARK, 'paca-s', (512, 512), args) == dict(
        model='paca-s', size='512x512', precision=None,
        error='stopped after --timeout 5 s')


def test_learning_check_weight_change_per_part():
    """learning_check.py's ``weight_change``: 0 for a part that did not
    move (a frozen backbone), ||dw|| / ||w|| for one that did."""
    tool = load_tool('learning_check')
    model = nn.Module()
    model.backbone = nn.Linear(3, 4)
    model.neck = nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 2))
    before = tool._weights(model)
    with torch.no_grad():
        model.neck[1].weight.add_(1.0)
    change = tool.weight_change(before, model)
    assert change['backbone'] == 0.0
    norm = sum(float(w.double().pow(2).sum()) for k, w in before.items()
               if k.startswith('neck.'))
    # (w + 1 rounds in float32: not exactly 1 apart)
    assert change['neck'] == pytest.approx((4 / norm) ** 0.5, rel=1e-6)


@needs_triton
def test_clustering_speed_prunes_under_the_interpreter(monkeypatch):
    """clustering_speed.py's A/B of pass 2 pruned against the full scan
    and its layout sweep (a GPU tool: here its CUDA timing stubbed, the
    kernels interpreted): the A/B runs the pruned layout, finds the same
    ids and reports the share of tokens pass 2 still scans; the sweep times
    every layout of 64 channels also pruned and keeps the fastest."""
    from fused_cases import interpreted, windows

    from clustr_mm.ops.dpc_knn import FUSED_PLAN, fused
    tool = load_tool('clustering_speed')
    timed = []

    def ms(fn, runs):  # runs fn; the n-th timing is n ms
        fn()
        timed.append(fn)
        return float(len(timed))
    monkeypatch.setattr(tool, 'cuda_time', ms)
    monkeypatch.setattr(tool, 'time_parts', lambda *args: {})
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda: (9, 0))
    monkeypatch.setattr(fused, 'MEASURED', dict(fused.MEASURED))
    x, counts, consts = windows((12, 14), 10, 2, 16, 1)
    with interpreted(fused):
        row = tool.pruned_row(x, counts, 5, consts, 'ieee', 1)
        timed.clear()
        x, counts, consts = windows((8, 8), None, 2, 64, 1)
        swept = tool.sweep([(x, counts, 5, consts, FUSED_PLAN)], 1)
    assert row['ids_vs_unpruned_pct'] == 0.0, row
    assert 0 < row['scanned_pct'] < 100, row
    layouts = tool.SWEEP[64]
    assert len(swept[64]['ms']) == 2 * len(layouts)  # each also pruned
    assert swept[64]['fastest'] == str(layouts[0])  # timed first: 1 ms
    assert fused.MEASURED[(9, 64, 'tf32x3')] == fused.KernelConfig(
        *layouts[0])

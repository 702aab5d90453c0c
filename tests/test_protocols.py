"""clustr_mm/protocols.py declares what the parts read across layers must
provide. A token reducer written from that declaration alone (below, in
this file) works in FLOP counting, ONNX export and checkpoint loading; the
clustering backends satisfy the backend declaration; a bad declaration is
named."""
import math

import pytest
import torch
import torch.nn.functional as F
from mmengine.registry import MODELS
from torch import nn

from clustr_mm.analysis.flops import analyze_flops
from clustr_mm.models.backbones.clustr import ClusTR
from clustr_mm.models.backbones.pretrained import load_backbone_state
from clustr_mm.models.layers.token_reducer import Reduction, TokenReducer
from clustr_mm.ops.dpc_knn import (CPU_PLAN, blocked, dispatch, fused,
                                   reference, register_backend)
from clustr_mm.protocols import (CheckedBackend, ClusteringBackend,
                                 backbone_strides, flop_kind,
                                 graph_static_hw)
from conftest import load_tool

ARCH = dict(embed_dims=(8, 16, 32, 64), depths=(1, 1, 1, 1),
            num_heads=(1, 1, 2, 4), mlp_ratios=(2, 2, 2, 2))


@MODELS.register_module(force=True)
class CellMeanReducer(TokenReducer):
    """Summary tokens: the mean of each sr x sr cell, then a linear map.
    Declared only as clustr_mm.protocols and TokenReducer say."""
    flop_kind = 'clustering'
    graph_static_hw = False

    def __init__(self, dim, sr_ratio=1):
        super().__init__()
        self.sr = max(1, sr_ratio)
        self.proj = nn.Linear(dim, dim)

    def num_tokens(self, hw):
        return [math.ceil(hw[0] / self.sr) * math.ceil(hw[1] / self.sr)]

    def forward(self, x, hw, weights=None):
        b, n, c = x.shape
        grid = x.transpose(1, 2).reshape(b, c, *hw)
        pooled = F.avg_pool2d(grid, self.sr, self.sr, ceil_mode=True)
        tokens = self.proj(pooled.flatten(2).transpose(1, 2))
        rows = torch.arange(hw[0], device=x.device) // self.sr
        cols = torch.arange(hw[1], device=x.device) // self.sr
        ids = (rows[:, None] * math.ceil(hw[1] / self.sr) + cols).flatten()
        return Reduction([tokens], [ids.expand(b, -1)])


def _model(seed=0):
    torch.manual_seed(seed)
    model = ClusTR(arch=dict(ARCH), reducers=dict(type='CellMeanReducer'))
    model.init_weights()
    return model.eval()


def test_a_reducer_from_the_declaration_counts_exports_and_loads(tmp_path):
    model = _model()
    assert flop_kind(model.stages[0].blocks[0].attn.clustering) == 'clustering'
    # FLOP counting: its linear map is counted as clustering
    report = analyze_flops(model, torch.rand(1, 3, 64, 64))
    assert report.by_part['backbone/clustering'] > 0, report.by_part
    # checkpoint loading: its weights go through the backbone's loader
    state = _model(seed=1).state_dict()
    loaded = load_backbone_state(model, state)
    assert not loaded['missing'] and not loaded['unexpected']
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        for a, b in zip(model(x), _model(seed=1)(x)):
            assert torch.equal(a, b)
    # ONNX export: one dynamic graph (the reducer does not declare
    # graph_static_hw), equal to PyTorch's outputs
    assert not any(graph_static_hw(m) for m in model.modules())
    tool = load_tool('pytorch2onnx', 'deployment')
    from mmengine.config import Config
    report = tool.export_and_check(
        Config(dict(model=dict(type='ClusTR', arch=dict(ARCH),
                               reducers=dict(type='CellMeanReducer')))),
        None, (64, 64), str(tmp_path / 'cell.onnx'), batch=1, dynamic=True,
        check_shapes=[(2, 48, 80)], log=lambda *a: None)
    assert report['dynamic_hw'] and (tmp_path / 'cell.onnx').is_file()
    assert max(r['max_abs_diff'] for r in report['checks']) <= 1e-4


def test_the_clustering_backends_satisfy_the_declaration():
    for backend in (fused, blocked, reference, *dispatch.BACKENDS):
        assert isinstance(backend, ClusteringBackend), backend
    # the first-use check reads these of the backend it wraps
    assert isinstance(fused, CheckedBackend)
    assert not isinstance(reference, CheckedBackend)
    assert backbone_strides(ClusTR) == (4, 8, 16, 32)


class CountingBackend:
    """A clustering backend written from the declaration alone: the
    reference's clusters, counting its calls."""
    NAME = 'counting'
    HOLDS_BLOCKS = True

    def __init__(self):
        self.calls = 0

    def why_not(self, task):
        return None if task.k <= 8 else 'counts up to k = 8'

    def run(self, x, counts, k, windows, plan):
        self.calls += 1
        return reference.run(x, counts, k, windows, plan)


def test_a_backend_from_the_declaration_is_registered_and_chosen(
        monkeypatch):
    monkeypatch.setattr(dispatch, 'BACKENDS', dispatch.BACKENDS)
    monkeypatch.setattr(dispatch, '_RUN', dict(dispatch._RUN))
    monkeypatch.setattr(dispatch, '_REGISTERED_PLANS', {})
    torch.manual_seed(0)
    model = ClusTR(arch=dict(ARCH), clustering_mode='window').eval()
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        before = model(x)
    backend = CountingBackend()
    plan = CPU_PLAN._replace(kernel='counting')
    register_backend(backend, plan, before='blocked')
    assert [b.NAME for b in dispatch.BACKENDS] == [
        'fused', 'counting', 'blocked', 'reference']
    torch.manual_seed(0)
    model = ClusTR(arch=dict(ARCH), clustering_mode='window').eval()
    with torch.no_grad():
        after = model(x)
    # chosen on the CPU (fused declines), run for every clustering block,
    # with the reference's clusters
    assert backend.calls == 3  # stages 1-3 (stage 4 keeps every token)
    for a, b in zip(before, after):
        assert torch.equal(a, b)
    reducer = model.stages[0].blocks[0].attn.clustering
    choice = reducer.backend(torch.device('cpu'))
    assert choice.backend == 'counting' and choice.plan.kernel == 'counting'
    assert dispatch.default_plan('counting', None) == plan
    # its own why_not is asked: k = 9 goes on to the blocked backend
    reducer.k = 9
    assert reducer.backend(torch.device('cpu')).not_taken[-1] == (
        'counting', 'counts up to k = 8')
    # FLOP counting traces the reference, whatever is registered
    assert analyze_flops(model, x).by_part['backbone/clustering'] > 0
    with pytest.raises(ValueError, match="a backend named 'counting' is "
                       'registered'):
        register_backend(backend, plan)
    with pytest.raises(ValueError, match="the default plan of 'other' names "
                       "'counting'"):
        register_backend(type('Other', (CountingBackend, ), dict(
            NAME='other'))(), plan)
    with pytest.raises(TypeError, match='is not a clustering backend'):
        register_backend(object(), plan)


def test_a_bad_flop_kind_is_named():
    class Odd(nn.Module):
        flop_kind = 'matmul'
    with pytest.raises(ValueError, match=r"Odd.flop_kind='matmul': must be "
                       r"one of \('embedding', 'attention', 'clustering', "
                       r"'mlp'\)"):
        flop_kind(Odd())

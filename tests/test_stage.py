"""What both backbones share through their stage module: gradient
checkpointing (``with_cp``), recorded assignments, and loading checkpoints
saved with ClusTR's earlier key layout."""
import os

import pytest
import torch
from mmengine.registry import MODELS
from mmengine.runner.checkpoint import load_checkpoint
from torch import nn

import clustr_mm  # noqa: F401
from clustr_mm.models.backbones import stage as stage_module

pytestmark = pytest.mark.torch21

DIMS = (16, 32, 48, 64)
SMALL = dict(embed_dims=DIMS, depths=(2, 1, 2, 1), num_heads=(1, 2, 2, 4),
             mlp_ratios=(2, 2, 2, 2))
BACKBONES = {
    'clustr-exact': dict(type='ClusTR', arch=SMALL),
    'clustr-window': dict(type='ClusTR', arch=SMALL,
                          clustering_mode='window', window_size=8),
    'paca-conv': dict(type='PaCaViT', arch=SMALL, num_clusters=(6, 5, 4, 0)),
    'paca-teacher': dict(type='PaCaViT', arch=dict(SMALL, teacher_depths=(
        1, 1, 1, 1)), clustering='teacher', num_clusters=(6, 5, 4, 3)),
}
# fp32: recomputing a block runs the same kernels on the same input, but the
# gradients may be summed in another order
TOL = dict(rtol=1e-5, atol=1e-7)


def build(name, **kwargs):
    torch.manual_seed(0)
    model = MODELS.build(dict(BACKBONES[name], **kwargs))
    model.init_weights()
    return model


def saved_bytes(model, x):
    """Bytes autograd keeps from the forward pass for the backward."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return total


def loss_and_grads(model, x, seed=1):
    torch.manual_seed(seed)  # the same drop-path draws in both runs
    outs = model(x)
    loss = sum((o * (i + 1)).square().mean() for i, o in enumerate(outs))
    model.zero_grad()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()
             if p.grad is not None}
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize('name', sorted(BACKBONES))
@pytest.mark.parametrize('shape', [(1, 3, 45, 71), (2, 3, 64, 40)])
def test_with_cp_gives_the_same_outputs_and_gradients(name, shape):
    plain = build(name, drop_path_rate=0.2).train()
    cp = build(name, drop_path_rate=0.2, with_cp=True).train()
    assert all(s.with_cp for s in cp.stages)
    x = torch.randn(shape)
    outs, grads = loss_and_grads(plain, x)
    cp_outs, cp_grads = loss_and_grads(cp, x)
    for a, b in zip(outs, cp_outs):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    trainable = {n for n, p in plain.named_parameters() if p.requires_grad}
    assert set(grads) == set(cp_grads)
    # every parameter gets a gradient, but a cluster's common weight factor
    # cancels in its weighted mean (weight_layer.bias: round-off only)
    assert {n for n in trainable - set(grads)} <= {
        n for n in trainable if n.endswith('weight_layer.bias')}
    for n in grads:
        torch.testing.assert_close(cp_grads[n], grads[n], **TOL, msg=n)
    # ...for much less memory: of the blocks, only their inputs are kept
    # (the teacher network is not checkpointed)
    ratio = 0.7 if name == 'paca-teacher' else 0.35
    assert saved_bytes(cp, x) < ratio * saved_bytes(plain, x)


@pytest.mark.parametrize('name', ['clustr-window', 'paca-conv'])
def test_with_cp_respects_frozen_stages_and_skips_without_grad(
        name, monkeypatch):
    plain = build(name, frozen_stages=1).train()
    cp = build(name, frozen_stages=1, with_cp=True).train()
    x = torch.randn(1, 3, 48, 56)
    outs, grads = loss_and_grads(plain, x)
    cp_outs, cp_grads = loss_and_grads(cp, x)
    assert set(grads) == set(cp_grads)
    assert not any(n.startswith('stages.0.') for n in cp_grads)
    for n in grads:
        torch.testing.assert_close(cp_grads[n], grads[n], **TOL, msg=n)
    # one checkpoint per block while training; none without gradients
    calls = []
    checkpoint = stage_module.checkpoint
    monkeypatch.setattr(stage_module, 'checkpoint',
                        lambda *a, **k: calls.append(1) or checkpoint(*a, **k))
    cp(x)
    assert len(calls) == sum(len(s.blocks) for s in cp.stages)
    calls.clear()
    with torch.no_grad():
        cp.eval()(x)
    assert not calls


def test_with_cp_under_ddp(tmp_path):
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip('torch built without distributed')
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/store',
                            rank=0, world_size=1)
    try:
        plain = build('clustr-window').train()
        cp = nn.parallel.DistributedDataParallel(
            build('clustr-window', with_cp=True).train())
        x = torch.randn(1, 3, 40, 56)
        _, grads = loss_and_grads(plain, x)
        for _ in range(2):  # DDP's reducer: each parameter ready once a step
            _, cp_grads = loss_and_grads(cp, x)
        cp_grads = {n[len('module.'):]: g for n, g in cp_grads.items()}
        assert set(grads) == set(cp_grads)
        for n in grads:
            torch.testing.assert_close(cp_grads[n], grads[n], **TOL, msg=n)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize('name', sorted(BACKBONES))
def test_kept_assignments_are_per_stage_block_and_scale(name):
    model = build(name, keep_assignments=True).eval()
    x = torch.randn(2, 3, 40, 56)
    with torch.no_grad():
        model(x)
    kept = model.assignments
    grids = [(10, 14), (5, 7), (3, 4), (2, 2)]
    assert [len(stage) for stage in kept] == [2, 1, 2, 1]
    for stage, (h, w) in zip(kept, grids):
        for scales in stage:
            for a in scales:
                assert a.shape[0] == 2 and a.shape[-2:] == (h, w)
                assert not a.requires_grad
    scales = [len(stage[0]) for stage in kept]
    assert scales == {'clustr-exact': [2, 2, 2, 0], 'clustr-window':
                      [2, 2, 2, 0], 'paca-conv': [1, 1, 1, 0],
                      'paca-teacher': [1, 1, 1, 1]}[name]
    model.keep_assignments = False
    assert model.assignments == []


def legacy_clustr_state(model):
    """The model's weights under the keys ClusTR used to save."""
    legacy = {}
    for key, value in model.state_dict().items():
        parts = key.split('.')
        if parts[2] == 'downsample':
            key = '.'.join(['patch_embeds', parts[1]] + parts[3:])
        elif parts[2] == 'blocks':
            key = '.'.join(['stages', parts[1]] + parts[3:])
        else:
            key = '.'.join(['norms', parts[1]] + parts[3:])
        legacy[key] = value.clone()
    return legacy


def test_clustr_checkpoints_of_the_earlier_key_layout_still_load(tmp_path):
    source = build('clustr-exact')
    legacy = legacy_clustr_state(source)
    assert 'patch_embeds.0.proj.weight' in legacy
    assert 'stages.0.1.attn.kv1.weight' in legacy
    assert 'norms.3.weight' in legacy

    target = build('clustr-exact')
    nn.init.zeros_(target.stages[0].downsample.proj.weight)
    target.load_state_dict(legacy, strict=True)  # torch's loader
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key

    # MMEngine's loader, a whole-model checkpoint with the backbone prefix
    path = os.path.join(tmp_path, 'old.pth')
    torch.save({'state_dict': {f'backbone.{k}': v
                               for k, v in legacy.items()}}, path)
    holder = nn.Module()
    holder.backbone = build('clustr-exact')
    nn.init.zeros_(holder.backbone.stages[3].norm.weight)
    load_checkpoint(holder, path, strict=True)
    for key, value in source.state_dict().items():
        assert torch.equal(holder.backbone.state_dict()[key], value), key
    assert type(source).upgrade_state_dict(legacy).keys() == set(
        source.state_dict())

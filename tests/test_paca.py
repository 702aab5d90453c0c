"""PaCa-ViT backbone: sizes, clustering semantics, loading and conversion."""
import re
from pathlib import Path

import pytest
import torch
from mmengine.model import BaseModule
from mmengine.registry import MODELS
from torch import nn

import clustr_mm  # noqa: F401  (registers the models)
from clustr_mm.models.backbones.paca import PaCaViT
from clustr_mm.checkpoints import load_backbone_state
from clustr_mm.checkpoints.paca_official import convert_paca_official

pytestmark = pytest.mark.torch21

# Narrow stand-in for the real archs; heads (2, 4, 8, 16) like the official
# models so the converter's head assumption holds.
ARCH = dict(embed_dims=(16, 32, 64, 64), num_heads=(2, 4, 8, 16),
            depths=(2, 1, 3, 1), teacher_depths=(1, 1, 2, 1))
CLUSTERS = (5, 6, 7, 0)


def build(clustering='conv', init=True, **kwargs):
    kwargs.setdefault('num_clusters',
                      (5, 6, 7, 8) if clustering == 'teacher' else CLUSTERS)
    model = PaCaViT(ARCH, clustering, **kwargs)
    if init:
        model.init_weights()
    return model


def randomise_bn(model):
    """Give BatchNorm non-trivial statistics so eval outputs depend on them."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)


def outputs(model, x):
    model.eval()
    with torch.no_grad():
        return model(x)


def assert_same(a, b, atol=1e-5):
    assert len(a) == len(b)
    for u, v in zip(a, b):
        torch.testing.assert_close(u, v, atol=atol, rtol=1e-4)


@pytest.mark.parametrize('arch, clustering, millions', [
    ('tiny', 'conv', 12.201), ('small', 'conv', 22.038),
    ('small', 'mlp', 22.637), ('small', 'teacher', 21.075),
    ('base', 'conv', 46.911), ('base', 'teacher', 47.659)])
def test_param_count_matches_official(arch, clustering, millions):
    model = PaCaViT(arch, clustering)
    head = model.embed_dims[-1] * 1000 + 1000  # 1000-class linear head
    total = sum(p.numel() for p in model.parameters()) + head
    assert abs(total / 1e6 - millions) / millions < 1e-3


@pytest.mark.parametrize('clustering', ['conv', 'mlp', 'teacher'])
def test_shapes_odd_size_batch_one(clustering):
    model = build(clustering)
    outs = outputs(model, torch.randn(1, 3, 33, 47))
    assert [tuple(o.shape) for o in outs] == [
        (1, 16, 9, 12), (1, 32, 5, 6), (1, 64, 3, 3), (1, 64, 2, 2)]
    assert all(o.is_contiguous() for o in outs)


def test_out_indices_subset_and_negative():
    model = build(out_indices=(1, -1))
    outs = outputs(model, torch.randn(2, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == [(2, 32, 8, 8), (2, 64, 2, 2)]


def test_real_arch_shapes_at_224():
    outs = outputs(PaCaViT('tiny'), torch.randn(1, 3, 224, 224))
    assert [tuple(o.shape) for o in outs] == [
        (1, 96, 56, 56), (1, 192, 28, 28), (1, 320, 14, 14), (1, 384, 7, 7)]


@pytest.mark.parametrize('clustering', ['conv', 'mlp', 'teacher'])
def test_assignments_sum_to_one_over_tokens(clustering):
    model = build(clustering, keep_assignments=True)
    outputs(model, torch.randn(2, 3, 40, 56))
    expected_clusters = (5, 6, 7, 8) if clustering == 'teacher' else CLUSTERS
    hw = [(10, 14), (5, 7), (3, 4), (2, 2)]
    for stage, m, (h, w) in zip(model.assignments, expected_clusters, hw):
        for scales in stage:  # per block, one soft map (none: full attn)
            assert len(scales) == (1 if m else 0)
            for a in scales:
                assert a.shape == (2, m, h, w)
                assert (a >= 0).all()
                torch.testing.assert_close(a.sum(dim=(2, 3)),
                                           torch.ones(2, m))


def test_assignments_not_kept_by_default():
    model = build()
    outputs(model, torch.randn(1, 3, 32, 32))
    assert model.assignments == []


def owners(model):
    return [[block.attn.clustering is not None for block in stage.blocks]
            for stage in model.stages]


def test_stage_wise_shared_assignment():
    model = build(keep_assignments=True)
    assert owners(model) == [[True, False], [True], [True, False, False],
                             [False]]
    # later blocks keep their own cluster LayerNorm
    assert all(hasattr(b.attn, 'cluster_norm')
               for s in model.stages[:3] for b in s.blocks)
    # ...and apply the first block's assignment to their own input
    seen = []
    model.stages[2].blocks[2].attn.register_forward_hook(
        lambda mod, args, out: seen.append(args[2]))
    outputs(model, torch.randn(1, 3, 64, 64))
    kept = model.assignments[2]
    torch.testing.assert_close(seen[0].reshape(kept[0][0].shape), kept[0][0])
    assert all(torch.equal(k[0], kept[0][0]) for k in kept[1:])


def test_per_block_assignment():
    shared, per_block = build(), build(clustering_interval=1,
                                       keep_assignments=True)
    assert owners(per_block) == [[True, True], [True], [True, True, True],
                                 [False]]
    outputs(per_block, torch.randn(1, 3, 64, 64))
    kept = per_block.assignments
    assert [[len(b) for b in s] for s in kept] == [[1, 1], [1], [1, 1, 1],
                                                  [0]]
    assert not torch.equal(kept[0][0][0], kept[0][1][0])
    n_shared = sum(p.numel() for p in shared.parameters())
    assert sum(p.numel() for p in per_block.parameters()) > n_shared
    assert owners(build(clustering_interval=2))[2] == [True, False, True]


def test_teacher_path():
    model = build('teacher', keep_assignments=True)
    assert not any(any(stage) for stage in owners(model))
    assert sorted(model.teacher.to_clusters) == ['0', '1', '2', '3']
    randomise_bn(model)
    x = torch.randn(1, 3, 48, 64)
    before = outputs(model, x)
    # every block of every stage applies the teacher's assignment
    assert [[len(b) for b in s] for s in model.assignments] == [
        [1] * len(s.blocks) for s in model.stages]
    # the teacher's assignments and its stage features both reach the output
    with torch.no_grad():
        model.teacher.to_clusters['2'].weight.mul_(3)
    changed = outputs(model, x)
    torch.testing.assert_close(changed[1], before[1])
    assert not torch.allclose(changed[2], before[2])
    with torch.no_grad():
        model.teacher.stages[0][0].pwconv.bias.add_(1)
    assert not torch.allclose(outputs(model, x)[0], before[0])


def test_teacher_with_unclustered_stage():
    model = build('teacher', num_clusters=(5, 0, 7, 0), keep_assignments=True)
    assert sorted(model.teacher.to_clusters) == ['0', '2']
    outputs(model, torch.randn(1, 3, 32, 32))
    assert [{len(b) for b in s} for s in model.assignments] == [
        {1}, {0}, {1}, {0}]


def test_frozen_stages():
    model = build(frozen_stages=2)
    model.train()
    frozen = [model.stem, model.stages[0], model.stages[1]]
    for module in frozen:
        assert not module.training
        assert not any(p.requires_grad for p in module.parameters())
    assert model.stages[2].training
    assert all(p.requires_grad for p in model.stages[2].parameters())


def test_frozen_stages_freeze_teacher_and_norm_eval():
    model = build('teacher', frozen_stages=1)
    model.train()
    assert not model.teacher.training
    assert not any(p.requires_grad for p in model.teacher.parameters())

    model = build('teacher', norm_eval=True)
    model.train()
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert bns and not any(bn.training for bn in bns)
    stats = bns[0].running_mean.clone()
    model(torch.randn(2, 3, 32, 32))
    torch.testing.assert_close(bns[0].running_mean, stats)
    assert model.stages[0].training


def save_as_classifier(model, path):
    state = {f'backbone.{k}': v for k, v in model.state_dict().items()}
    state['head.fc.weight'] = torch.zeros(10, 64)
    torch.save({'state_dict': state, 'meta': {}}, path)


class Wrapper(BaseModule):
    """Stands in for a detector: mmengine calls the backbone's init."""

    def __init__(self, backbone_cfg):
        super().__init__()
        self.backbone = MODELS.build(backbone_cfg)


def test_pretrained_survives_init_weights(tmp_path):
    source = build('teacher')
    randomise_bn(source)
    save_as_classifier(source, tmp_path / 'ckpt.pth')
    cfg = dict(type='PaCaViT', arch=ARCH, clustering='teacher',
               num_clusters=(5, 6, 7, 8),
               init_cfg=dict(type='Pretrained',
                             checkpoint=str(tmp_path / 'ckpt.pth'),
                             prefix='backbone.'))
    wrapper = Wrapper(cfg)
    wrapper.init_weights()
    wrapper.init_weights()  # a second call must not re-initialise
    expected = source.state_dict()
    for key, value in wrapper.backbone.state_dict().items():
        torch.testing.assert_close(value, expected[key], msg=key)


def test_pretrained_from_runner_checkpoint(tmp_path):
    from mmengine.logging import HistoryBuffer
    source = build()
    state = {f'backbone.{k}': v for k, v in source.state_dict().items()}
    loss = HistoryBuffer()
    loss.update(0.5)
    torch.save({'state_dict': state, 'meta': {'epoch': 3},
                'message_hub': {'log_scalars': {'loss': loss}}},
               tmp_path / 'epoch_3.pth')
    target = build(init=False, init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'epoch_3.pth'),
        prefix='backbone.'))
    target.init_weights()
    torch.testing.assert_close(target.stages[3].norm.weight,
                               source.stages[3].norm.weight)


@pytest.mark.parametrize('clustering, layers', [
    ('conv', ['stages.{}.blocks.0.attn.clustering.to_clusters']),
    ('mlp', ['stages.{}.blocks.0.attn.clustering.fc2']),
    ('teacher', ['teacher.to_clusters.{}']),
])
def test_cluster_count_mismatch(tmp_path, clustering, layers):
    source = build(clustering)
    save_as_classifier(source, tmp_path / 'ckpt.pth')
    more = (10, 12, 14, 16) if clustering == 'teacher' else (10, 12, 14, 0)
    target = build(clustering, init=False, num_clusters=more,
                   init_cfg=dict(type='Pretrained',
                                 checkpoint=str(tmp_path / 'ckpt.pth'),
                                 prefix='backbone.'))
    with pytest.warns(UserWarning) as record:
        target.init_weights()
    message = ' '.join(str(w.message) for w in record)
    expected_layers = {layer.format(i) for layer in layers
                       for i in range(4) if more[i]}
    for layer in expected_layers:
        assert layer in message
    reinit = {k for k in target.state_dict()
              if k.rsplit('.', 1)[0] in expected_layers}
    assert reinit
    src = source.state_dict()
    for key, value in target.state_dict().items():
        if key in reinit:
            assert value.shape != src[key].shape
        else:
            torch.testing.assert_close(value, src[key], msg=key)


def test_loader_reinitialises_and_reports_mismatched_layers():
    source, target = build(), build(num_clusters=(10, 12, 14, 0))
    layer = target.stages[0].blocks[0].attn.clustering.to_clusters
    with torch.no_grad():
        layer.weight.fill_(7.0)
    name = 'stages.0.blocks.0.attn.clustering.to_clusters'
    with pytest.warns(UserWarning, match=re.escape(name)):
        report = load_backbone_state(target, source.state_dict())
    assert name in report['reinitialized']
    assert not (layer.weight == 7.0).any()
    torch.testing.assert_close(target.stem.conv1.weight,
                               source.stem.conv1.weight)


def test_loader_rejects_checkpoints_that_match_nothing(tmp_path):
    model = build()
    with pytest.raises(RuntimeError, match='none of'):
        load_backbone_state(model, {'foo.weight': torch.zeros(3)})
    with pytest.raises(RuntimeError, match='prefix'):
        load_backbone_state(model, model.state_dict(), prefix='backbone.')
    missing = build(init=False, init_cfg=dict(
        type='Pretrained', checkpoint=str(tmp_path / 'nope.pth')))
    with pytest.raises(FileNotFoundError):
        missing.init_weights()


@pytest.mark.parametrize('kwargs, argument', [
    (dict(arch='huge'), 'arch'),
    (dict(arch=dict(ARCH, num_heads=(3, 4, 8, 16))), 'num_heads'),
    (dict(arch=dict(embed_dims=(8, 16, 32, 64))), 'arch'),
    (dict(arch=dict(ARCH, depth=(1, 1, 1, 1))), 'arch'),
    (dict(arch=dict(ARCH, depths=(1, 1, 1))), 'depths'),
    (dict(clustering='kmeans'), 'clustering'),
    (dict(num_clusters=(100, 100)), 'num_clusters'),
    (dict(out_indices=(4, )), 'out_indices'),
    (dict(frozen_stages=5), 'frozen_stages'),
    (dict(drop_path_rate=-0.1), 'drop_path_rate'),
    (dict(clustering_interval=-1), 'clustering_interval'),
])
def test_bad_arguments(kwargs, argument):
    kwargs = {'arch': ARCH, **kwargs}
    with pytest.raises(ValueError, match=argument):
        PaCaViT(**kwargs)


def test_wrong_input_channels():
    with pytest.raises(ValueError, match='expects'):
        build()(torch.randn(1, 1, 32, 32))


def test_registered_in_root_registry():
    model = MODELS.build(
        dict(type='PaCaViT', arch=ARCH, num_clusters=CLUSTERS))
    assert isinstance(model, PaCaViT)


@pytest.mark.parametrize('clustering', ['conv', 'mlp', 'teacher'])
def test_gradients_reach_every_parameter(clustering):
    # No drop path: a randomly dropped branch would leave its norm without a
    # gradient, and this test is about the wiring, not the sampling.
    torch.manual_seed(0)
    model = build(clustering, drop_path_rate=0.0)
    model.train()
    outs = model(torch.randn(2, 3, 32, 48))
    sum(o.square().mean() for o in outs).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


# --- official checkpoint conversion -------------------------------------
# Our key -> official key, written independently of the converter from the
# official key list. Official stage{i} / norm{i} / block{i} are
# 1-based; official transition{i} leads into our (0-based) stage i.
def _n(m, group=1):
    return int(m[group]) + 1


_BLOCK = r'stages\.(\d)\.blocks\.(\d+)\.'
_TEACHER = r'teacher\.'
TO_OFFICIAL = [
    (r'stem\.conv1\.', lambda m: 'patch_embed.proj.0.'),
    (r'stem\.conv2\.', lambda m: 'patch_embed.proj.1.'),
    (r'stem\.norm\.', lambda m: 'patch_embed.norm.'),
    (r'stages\.(\d)\.downsample\.conv\.', lambda m: f'transition{m[1]}.proj.'),
    (r'stages\.(\d)\.downsample\.norm\.', lambda m: f'transition{m[1]}.norm.'),
    (r'stages\.(\d)\.norm\.', lambda m: f'norm{_n(m)}.'),
    (_BLOCK + r'norm1\.', lambda m: f'stage{_n(m)}.{m[2]}.norm1_before.'),
    (_BLOCK + r'norm2\.', lambda m: f'stage{_n(m)}.{m[2]}.norm2_before.'),
    (_BLOCK + r'ffn\.dwconv\.',
     lambda m: f'stage{_n(m)}.{m[2]}.mlp.dwconv.dwconv.'),
    (_BLOCK + r'ffn\.', lambda m: f'stage{_n(m)}.{m[2]}.mlp.'),
    (_BLOCK + r'attn\.clustering\.(dwconv|fc1)\.',
     lambda m: f'stage{_n(m)}.{m[2]}.attn.clustering.clustering.0.'),
    (_BLOCK + r'attn\.clustering\.(pwconv|fc2)\.',
     lambda m: f'stage{_n(m)}.{m[2]}.attn.clustering.clustering.2.'),
    (_BLOCK + r'attn\.clustering\.to_clusters\.',
     lambda m: f'stage{_n(m)}.{m[2]}.attn.clustering.clustering.4.'),
    (_BLOCK + r'attn\.', lambda m: f'stage{_n(m)}.{m[2]}.attn.'),
    (_TEACHER + r'stages\.(\d)\.(\d+)\.dwconv\.',
     lambda m: f'paca_teacher.block{_n(m)}.{m[2]}.0.fn.0.'),
    (_TEACHER + r'stages\.(\d)\.(\d+)\.norm1\.',
     lambda m: f'paca_teacher.block{_n(m)}.{m[2]}.0.fn.2.'),
    (_TEACHER + r'stages\.(\d)\.(\d+)\.pwconv\.',
     lambda m: f'paca_teacher.block{_n(m)}.{m[2]}.1.'),
    (_TEACHER + r'stages\.(\d)\.(\d+)\.norm2\.',
     lambda m: f'paca_teacher.block{_n(m)}.{m[2]}.3.'),
    (_TEACHER + r'downsamples\.(\d)\.conv\.',
     lambda m: f'paca_teacher.transition{_n(m)}.0.conv.'),
    (_TEACHER + r'downsamples\.(\d)\.norm\.',
     lambda m: f'paca_teacher.transition{_n(m)}.2.'),
    (_TEACHER + r'laterals\.(\d)\.conv\.',
     lambda m: f'paca_teacher.lateral{_n(m)}.0.'),
    (_TEACHER + r'laterals\.(\d)\.norm\.',
     lambda m: f'paca_teacher.lateral{_n(m)}.2.'),
    (_TEACHER + r'fpns\.(\d)\.dwconv\.',
     lambda m: f'paca_teacher.fpn{_n(m)}.0.fn.0.'),
    (_TEACHER + r'fpns\.(\d)\.norm1\.',
     lambda m: f'paca_teacher.fpn{_n(m)}.0.fn.2.'),
    (_TEACHER + r'fpns\.(\d)\.pwconv\.',
     lambda m: f'paca_teacher.fpn{_n(m)}.1.'),
    (_TEACHER + r'fpns\.(\d)\.norm2\.',
     lambda m: f'paca_teacher.fpn{_n(m)}.3.'),
    (_TEACHER + r'to_clusters\.(\d)\.',
     lambda m: f'paca_teacher.to_clusters{_n(m)}.'),
]


def to_official(state, clustering):
    official = {}
    for key, value in state.items():
        for pattern, rename in TO_OFFICIAL:
            m = re.match(pattern, key)
            if m:
                new = rename(m) + key[m.end():]
                if clustering == 'conv' and re.search(
                        r'clustering\.clustering\.[24]\.weight$', new):
                    value = value[:, :, None, None]  # official 1x1 convs
                official[new] = value
                break
        else:
            raise AssertionError(f'no official name for {key}')
    for i in range(1, 4):  # the teacher's fixed blur kernels
        conv = f'paca_teacher.transition{i}.0.conv.weight'
        if conv in official:
            official[f'paca_teacher.transition{i}.0.blur_filter'] = (
                torch.ones(official[conv].shape[1], 1, 3, 3) / 16)
    return official


@pytest.mark.parametrize('clustering', ['conv', 'mlp', 'teacher'])
def test_converter_round_trip(clustering):
    model = build(clustering)
    randomise_bn(model)
    official = to_official(model.state_dict(), clustering)
    official['head.weight'] = torch.randn(10, 64)
    official['head.bias'] = torch.randn(10)
    assert 'stage1.0.attn.q.weight' in official
    if clustering == 'conv':
        assert official['stage1.0.attn.clustering.clustering.4.weight'].dim() \
            == 4
    converted, skipped = convert_paca_official(official)
    assert skipped == []
    torch.testing.assert_close(converted.pop('head.fc.bias'),
                               official['head.bias'])
    converted.pop('head.fc.weight')
    assert all(k.startswith('backbone.') for k in converted)
    fresh = build(clustering)
    fresh.load_state_dict({k[len('backbone.'):]: v
                           for k, v in converted.items()}, strict=True)
    x = torch.randn(1, 3, 40, 48)
    assert_same(outputs(fresh, x), outputs(model, x))

    # an official mmdet / mmseg checkpoint: backbone.* plus neck and heads
    detector = {f'backbone.{k}': v for k, v in official.items()
                if not k.startswith('head.')}
    detector['neck.lateral_convs.0.conv.weight'] = torch.zeros(1)
    converted, skipped = convert_paca_official(detector)
    assert skipped == ['neck.lateral_convs.0.conv.weight']
    assert not any(k.startswith('head.') for k in converted)
    fresh.load_state_dict({k[len('backbone.'):]: v
                           for k, v in converted.items()}, strict=True)


def test_converter_cli_output_loads_with_prefix(tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'paca_official_to_mm', Path(__file__).resolve().parents[1] /
        'tools/model_converters/paca_official_to_mm.py')
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)

    model = build('teacher')
    randomise_bn(model)
    official = to_official(model.state_dict(), 'teacher')
    official['head.weight'] = torch.randn(10, 64)
    official['head.bias'] = torch.randn(10)
    torch.save(official, tmp_path / 'official.pth')
    assert cli.main([str(tmp_path / 'official.pth'),
                     str(tmp_path / 'mm.pth')]) == 0
    ckpt = torch.load(tmp_path / 'mm.pth', weights_only=True)
    assert ckpt['meta']['backbone']['clustering'] == 'teacher'
    assert ckpt['state_dict']['head.fc.weight'].shape == (10, 64)
    loaded = PaCaViT(**{k: v for k, v in ckpt['meta']['backbone'].items()
                        if k != 'type'},
                     init_cfg=dict(type='Pretrained',
                                   checkpoint=str(tmp_path / 'mm.pth'),
                                   prefix='backbone.'))
    loaded.init_weights()
    x = torch.randn(1, 3, 32, 40)
    assert_same(outputs(loaded, x), outputs(model, x))

    torch.save({'foo': torch.zeros(1)}, tmp_path / 'other.pth')
    assert cli.main([str(tmp_path / 'other.pth'),
                     str(tmp_path / 'bad.pth')]) == 1

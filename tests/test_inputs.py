"""Bad input and bad construction arguments fail early with a message that
names the problem; unusual but valid inputs work."""
import pytest
import torch
from mmengine.registry import MODELS

import clustr_mm  # noqa: F401

SMALL = {
    'ClusTR': dict(embed_dims=(8, 16, 32, 64), depths=(1, 1, 1, 1),
                   num_heads=(1, 1, 2, 4), mlp_ratios=(2, 2, 2, 2)),
    'PaCaViT': dict(embed_dims=(8, 16, 32, 64), depths=(1, 1, 1, 1),
                    num_heads=(1, 1, 2, 4), mlp_ratios=(2, 2, 2, 2)),
}


def build(name, **kwargs):
    extra = dict(clustering_mode='window') if name == 'ClusTR' else {}
    extra.update(kwargs)
    return MODELS.build(dict(type=name, arch=SMALL[name], **extra)).eval()


@pytest.fixture(params=sorted(SMALL))
def backbone(request):
    return build(request.param), request.param


@pytest.mark.parametrize('shape', [(1, 4, 64, 64), (3, 64, 64), (1, 3, 0, 64)])
def test_bad_shape_is_named(backbone, shape):
    model, name = backbone
    with pytest.raises(ValueError, match=rf'{name} .*{tuple(shape)}'.replace(
            '(', r'\(').replace(')', r'\)')):
        model(torch.zeros(shape))


def test_non_tensor_input(backbone):
    model, name = backbone
    with pytest.raises(TypeError, match=f'{name} expects a tensor'):
        model([[1.0]])


@pytest.mark.parametrize('bad', [float('nan'), float('inf')])
def test_non_finite_input_refused(backbone, bad):
    model, name = backbone
    x = torch.randn(1, 3, 64, 64)
    x[0, 1, 5, 7] = bad
    # a device-side check (no host sync): RuntimeError on every device
    with pytest.raises(RuntimeError, match=f'{name} input contains NaN or Inf'):
        model(x)


@pytest.mark.parametrize('name', sorted(SMALL))
def test_non_finite_weights_are_named(name):
    model = build(name)
    with torch.no_grad():
        model.stages[1].blocks[0].norm1.weight.fill_(float('nan'))
    with pytest.raises(RuntimeError, match=(
            r"stage 2 produced NaN/Inf .*weight tensor\(s\) hold NaN/Inf, "
            r"first \['stages\.1\.blocks\.0\.norm1\.weight'\]")):
        model(torch.randn(1, 3, 64, 64))


@pytest.mark.parametrize('name', sorted(SMALL))
def test_overflowing_images_are_named_not_called_a_divergence(name):
    model = build(name)
    torch.manual_seed(0)
    x = torch.randn(1, 3, 64, 64)
    with pytest.raises(RuntimeError, match=(
            r'stage 1 produced NaN/Inf .*the images reach \|x\| = '
            r'\d\.\d+e\+20')) as error:
        model(x * 1e20)
    assert 'diverged' not in str(error.value)
    with torch.no_grad():  # large but representable: still runs
        assert all(torch.isfinite(o).all() for o in model(x * 1e5))


def test_empty_batch_gives_empty_maps(backbone):
    model, _ = backbone
    with torch.no_grad():
        outs = model(torch.zeros(0, 3, 64, 48))
    assert [tuple(o.shape) for o in outs] == [
        (0, 8, 16, 12), (0, 16, 8, 6), (0, 32, 4, 3), (0, 64, 2, 2)]


@pytest.mark.parametrize('hw,expect', [
    ((8, 8), [(2, 2), (1, 1), (1, 1), (1, 1)]),
    ((1, 1), [(1, 1)] * 4),
    ((32, 1024), [(8, 256), (4, 128), (2, 64), (1, 32)]),
])
def test_tiny_and_extreme_aspect_images(backbone, hw, expect):
    model, _ = backbone
    with torch.no_grad():
        outs = model(torch.randn(1, 3, *hw))
    assert [tuple(o.shape[2:]) for o in outs] == expect
    assert all(torch.isfinite(o).all() for o in outs)


@pytest.mark.parametrize('name', sorted(SMALL))
@pytest.mark.parametrize('kwargs,word', [
    (dict(arch='huge'), 'arch'),
    (dict(arch=dict(SMALL['ClusTR'], embed_dims=(8, 16, 30, 64),
                    num_heads=(1, 1, 4, 4))), 'divisible'),
    (dict(out_indices=(0, 4)), 'out_indices'),
    (dict(drop_path_rate=-0.1), 'drop_path_rate'),
    (dict(frozen_stages=7), 'frozen_stages'),
])
def test_bad_construction_arguments_are_named(name, kwargs, word):
    cfg = dict(type=name, arch=SMALL[name])
    cfg.update(kwargs)
    with pytest.raises(ValueError, match=word):
        MODELS.build(cfg)


def arch_with(name, **settings):
    return dict(SMALL[name], **settings)


# argument, value found and what is expected, all named
@pytest.mark.parametrize('name', sorted(SMALL))
@pytest.mark.parametrize('kwargs,message', [
    (dict(arch=dict(num_heads=(0, 1, 2, 4))),
     r"arch 'num_heads' must be a sequence of 4 ints >= 1 .*"
     r"got \(0, 1, 2, 4\)"),
    (dict(arch=dict(embed_dims=(0, 16, 32, 64))),
     r"arch 'embed_dims' must be .* ints >= 1 .*got \(0, 16, 32, 64\)"),
    (dict(arch=dict(mlp_ratios=(0, 2, 2, 2))),
     r"arch 'mlp_ratios' must be .* numbers >= 1e-09 .*got \(0, 2, 2, 2\)"),
    (dict(arch=dict(depths=(1.0, 1.0, 1.0, 1.0))),
     r"arch 'depths' must be .* ints >= 1 .*got \(1\.0, 1\.0, 1\.0, 1\.0\)"),
    (dict(arch=dict(depths=(-1, 1, 1, 1))),
     r"arch 'depths' must be .* ints >= 1 .*got \(-1, 1, 1, 1\)"),
    (dict(arch=dict(depths=3)), r"arch 'depths' must be a sequence .*got 3"),
    (dict(in_channels=0), r'in_channels must be an int >= 1, got 0'),
    (dict(frozen_stages=1.5), r'frozen_stages must be an int >= -1, got 1\.5'),
    (dict(out_indices=(True, )),
     r'out_indices entry True is not a stage index \(an int in \[-4, 3\]\)'),
    (dict(out_indices='0'), r"out_indices must be an int or a sequence of "
     r"ints, got '0'"),
    (dict(with_cp=1), r'with_cp must be True or False, got 1'),
])
def test_construction_errors_name_argument_value_and_expectation(
        name, kwargs, message):
    if 'arch' in kwargs:
        kwargs = dict(kwargs, arch=arch_with(name, **kwargs['arch']))
    with pytest.raises(ValueError, match=message):
        MODELS.build(dict(type=name, **{'arch': SMALL[name], **kwargs}))


@pytest.mark.parametrize('name,kwargs,message', [
    ('ClusTR', dict(window_size=8.0), r'window_size must be a positive int '
     r'\(stage 1, halved per stage\) or 4 positive ints, got 8\.0'),
    ('ClusTR', dict(window_size=(8, 4)), r'window_size must be a positive '
     r'int or 4 positive ints \(one per stage\), got \(8, 4\)'),
    ('ClusTR', dict(max_chunk_elems=0),
     r'max_chunk_elems must be an int >= 1, got 0'),
    ('PaCaViT', dict(num_clusters=100), r'num_clusters must be a sequence of '
     r'4 ints >= 0 \(one per stage\), got 100'),
    ('PaCaViT', dict(clustering_interval=-1),
     r'clustering_interval must be an int >= 0, got -1'),
])
def test_backbone_specific_errors_are_named(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        MODELS.build(dict(type=name, arch=SMALL[name], **kwargs))


def test_clustr_bad_clustering_settings_are_named():
    for kwargs, word in [(dict(clustering_mode='grid'), 'clustering_mode'),
                         (dict(window_size=0), 'window_size'),
                         (dict(arch=dict(SMALL['ClusTR'], sr_ratios=(8, 0, 2, 1))),
                          'sr_ratio')]:
        with pytest.raises(ValueError, match=word):
            MODELS.build(dict(type='ClusTR', **{'arch': SMALL['ClusTR'],
                                                **kwargs}))


def test_paca_bad_cluster_counts_are_named():
    with pytest.raises(ValueError, match='num_clusters'):
        MODELS.build(dict(type='PaCaViT', arch=SMALL['PaCaViT'],
                          num_clusters=(100, -1, 100, 0)))

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


def test_diverged_activations_never_cluster_silently():
    model = build('ClusTR')
    with torch.no_grad():
        model.patch_embeds[0].proj.weight.fill_(float('nan'))
    with pytest.raises(RuntimeError,
                       match='stage 1 produced non-finite activations'):
        model(torch.randn(1, 3, 64, 64))


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

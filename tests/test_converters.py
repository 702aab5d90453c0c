"""One converter protocol for every checkpoint layout clustr_mm converts:
detect the layout, convert the keys (backbone under ``backbone.``, for both
backbones), infer the backbone's config."""
import pytest
import torch
from mmengine.registry import MODELS

import clustr_mm  # noqa: F401
from clustr_mm.checkpoints import CONVERTERS, find_converter
from test_clustr import to_official as clustr_official_keys
from test_paca import build as build_paca
from test_paca import to_official as paca_official_keys
from test_stage import legacy_clustr_state

pytestmark = pytest.mark.torch21


def _backbones():
    """ClusTR-T and a small PaCa-ViT with every parameter and buffer drawn
    at random: at their initial values many tensors are equal (every
    LayerNorm's weight is ones), so a converter that swapped two of them
    (norm1 for norm2) would still round-trip."""
    torch.manual_seed(0)
    clustr = MODELS.build(dict(type='ClusTR', arch='tiny'))
    paca = build_paca('conv', init=False)
    with torch.no_grad():
        for model in (clustr, paca):
            for tensor in model.state_dict().values():
                if tensor.is_floating_point():
                    tensor.copy_(torch.randn_like(tensor))
    return clustr, paca


def test_each_layout_is_detected_converted_and_inferred():
    clustr, paca = _backbones()
    sources = [
        (clustr, clustr_official_keys(clustr.state_dict()),
         'ImageNet classifier', dict(arch='tiny')),
        (paca, paca_official_keys(paca.state_dict(), 'conv'),
         'timm ImageNet classifier', None),
        (clustr, {f'backbone.{k}': v for k, v in
                  legacy_clustr_state(clustr).items()},
         'backbone or whole model', dict(arch='tiny')),
    ]
    for (model, state, layout, config), converter in zip(sources,
                                                         CONVERTERS):
        found, named = find_converter(state)
        assert (found, named) == (converter, layout)
        assert found.backbone == type(model).__name__
        converted, unmatched = found.convert(state)
        assert unmatched == []
        expected = {f'backbone.{k}': v for k, v in model.state_dict().items()}
        assert converted.keys() == expected.keys(), layout
        assert all(torch.equal(converted[k], v.reshape(converted[k].shape))
                   for k, v in expected.items())
        inferred = found.infer_config(converted)
        if config is not None:
            assert inferred == config
        else:  # PaCa: a dict arch (the test's small one) and its settings
            rebuilt = MODELS.build(dict(type=found.backbone, **inferred))
            assert rebuilt.state_dict().keys() == model.state_dict().keys()


def test_todays_keys_need_no_converter():
    clustr, paca = _backbones()
    for model in (clustr, paca):
        state = model.state_dict()
        assert find_converter(state) is None
        assert find_converter({f'backbone.{k}': v
                               for k, v in state.items()}) is None


def test_release_variant_names_the_release_models():
    from clustr_mm.checkpoints.paca_official import release_variant
    assert release_variant(dict(arch='small')) == 'small_p2cconv_100_0'
    assert release_variant(dict(arch='tiny', clustering='teacher')) == \
        'convmixer_tiny_100'
    assert release_variant(dict(arch='small', num_clusters=(100,) * 4,
                                clustering_interval=1)) == \
        'small_p2cconv_100_blockwise'
    assert release_variant(dict(arch='small', num_clusters=(7, 7, 7, 0))) \
        == 'small_p2cconv_unnamed'
    # settings the release has no model of
    assert release_variant(dict(arch='small', reducers=dict())) is None
    assert release_variant(dict(arch=dict(depths=(1, 1, 1, 1)))) is None

"""Every shipped config loads, builds with its library, has the size the
papers report for it, and starts from weights a user can get: the official
PaCa-ViT release by URL, or a documented local path where nothing was
released (ClusTR)."""
import importlib
import re
from pathlib import Path

import pytest
from mmengine.config import Config
from mmengine.registry import DefaultScope

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(str(p.relative_to(ROOT))
                 for p in (ROOT / 'configs').glob('*/*.py')
                 if not p.parent.name.startswith('_'))

# Whole-model parameters (M) published by the papers, checked within 2%.
PUBLISHED_PARAMS = {
    'configs/clustr/mask-rcnn_clustr-s_fpn_1x_coco.py': 42.3,
    'configs/clustr/retinanet_clustr-s_fpn_1x_coco.py': 32.4,
    'configs/clustr/fpn_clustr-s_8xb2-80k_ade20k-512x512.py': 26.4,
    'configs/clustr/upernet_clustr-s_8xb2-160k_ade20k-512x512.py': 52.5,
    'configs/paca/mask-rcnn_paca-t_fpn_ms-1x_coco.py': 32.0,
    'configs/paca/mask-rcnn_paca-s_fpn_ms-1x_coco.py': 41.8,
    'configs/paca/mask-rcnn_paca-b_fpn_ms-1x_coco.py': 66.6,
    'configs/paca/upernet_paca-s_8xb2-160k_ade20k-512x512.py': 51.4,
}


# Every file of the official PaCa-ViT release (github.com/iVMCL/PaCaViT), by
# its real name: the official README's tables link some rows to the wrong file
# (the ImageNet 100-100-100-100 row to the 100-81-64-49 file, the Mask R-CNN
# small-teacher row to the tiny-teacher file), so neither of those two models
# has a file here. The PaCa-head segmentors are listed for completeness.
RELEASE = 'https://github.com/iVMCL/PaCaViT/releases/download/pacavit/'
_SMALL_ABLATIONS = ['2_0', '49_0', '49_100', '100_49', '100_blockwise']
RELEASE_FILES = frozenset(
    [f'IMNET_224_pacavit_{v}.pth' for v in (
        'tiny_p2cconv_100_0', 'small_p2cconv_100_0', 'base_p2cconv_100_0',
        'small_p2cmlp_100_0', 'convmixer_small_100', 'convmixer_base_100',
        *(f'small_p2cconv_{a}' for a in _SMALL_ABLATIONS))]
    + [f'mask_rcnn_pacavit_{v}_mstrain_480_800_1x_coco.pth' for v in (
        'tiny_p2cconv_100_0', 'small_p2cconv_100_0', 'base_p2cconv_100_0',
        'small_p2cmlp_100_0', 'convmixer_tiny_100_0', 'convmixer_base_100_0',
        'small_p2cconv_100',
        *(f'small_p2cconv_{a}' for a in _SMALL_ABLATIONS))]
    + [f'{head}_pacavit_{v}_512x512_160k_ade20k.pth' for head, v in (
        *(('upernet', f'{a}_p2cconv_100_0') for a in ('tiny', 'small', 'base')),
        *(('pacahead', f'{a}_p2cconv_100_0') for a in ('tiny', 'small', 'base')),
        ('pacahead', 'small_p2cmlp_100_0'),
        ('pacahead', 'convmixer_small_100_0'),
        ('pacahead', 'convmixer_base_100_0'),
        *(('upernet', f'small_p2cconv_{a}')
          for a in ('2_0', '49_0', '49_100', '100_49', '100', '100_blockwise'))
    )])
# The release's names for PaCa-ViT cluster counts per stage. Segmentation
# fine-tunes the 100-cluster classifier with 200 clusters and keeps its name.
_CLUSTER_NAMES = {(100, 100, 100, 0): '100_0', (200, 200, 200, 0): '100_0',
                  (2, 2, 2, 0): '2_0',
                  (49, 49, 49, 0): '49_0', (49, 64, 81, 100): '49_100',
                  (100, 81, 64, 49): '100_49', (100, 100, 100, 100): '100'}


# Backbone arguments that the release's names encode or that do not change
# the model; any other (e.g. a token reducer of ours) makes it a model the
# release does not have.
_NAMED_ARGS = {'type', 'arch', 'clustering', 'num_clusters',
               'clustering_interval', 'drop_path_rate', 'out_indices',
               'init_cfg', 'frozen_stages', 'norm_eval', '_delete_'}


def release_variant(backbone):
    """The release's name of a PaCa-ViT backbone setting, e.g.
    'small_p2cconv_100_0', or None for one the release has no name for."""
    if set(backbone) - _NAMED_ARGS:
        return None
    arch = backbone.get('arch', 'small')
    clustering = backbone.get('clustering', 'conv')
    if clustering == 'teacher':
        return f'convmixer_{arch}_100'
    clusters = tuple(backbone.get('num_clusters', (100, 100, 100, 0)))
    name = _CLUSTER_NAMES.get(clusters, 'unnamed')
    if backbone.get('clustering_interval') == 1:
        name += '_blockwise'
    return f'{arch}_p2c{clustering}_{name}'


def release_file(cfg):
    """The release file a PaCa-ViT config reproduces, by the release's naming
    (whether or not it was published), or None for a kind of model the
    release has none of."""
    model, backbone = cfg.model, cfg.model.backbone
    if backbone.type != 'PaCaViT' or 'embedded' in cfg.filename:
        return None
    variant = release_variant(backbone)
    if variant is None:
        return None
    if model.type == 'ImageClassifier':
        return f'IMNET_224_pacavit_{variant}.pth'
    if model.type == 'MaskRCNN':
        if variant.startswith('convmixer'):
            variant += '_0'
        return f'mask_rcnn_pacavit_{variant}_mstrain_480_800_1x_coco.pth'
    if model.get('decode_head', {}).get('type') == 'UPerHead':
        return f'upernet_pacavit_{variant}_512x512_160k_ade20k.pth'
    return None


def build_model(cfg):
    scope = cfg.default_scope
    importlib.import_module(f'{scope}.utils').register_all_modules(False)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        return registry.build(cfg.model)


def test_configs_found():
    assert len(CONFIGS) >= 25  # the glob really finds the zoo


@pytest.mark.parametrize('path', CONFIGS)
def test_config_builds(path):
    cfg = Config.fromfile(ROOT / path)
    assert cfg.custom_imports['imports'] == ['clustr_mm']
    model = build_model(cfg)
    backbone = cfg.model.backbone
    assert type(model.backbone).__name__ == backbone.type
    # No weights of the inherited base (e.g. the Swin base's URL) linger.
    assert not cfg.get('pretrained'), cfg.pretrained
    if 'embedded' not in path:
        init = backbone.get('init_cfg') or {}
        if cfg.default_scope != 'mmpretrain':
            # Downstream configs fine-tune from the ImageNet checkpoint.
            assert init.get('type') == 'Pretrained', path
            assert init.get('prefix') == 'backbone.', path
            assert init.get('checkpoint') == cfg.imagenet_checkpoint
    params = sum(p.numel() for p in model.parameters()) / 1e6
    if path in PUBLISHED_PARAMS:
        assert params == pytest.approx(PUBLISHED_PARAMS[path], rel=0.02), params


# ImageNet configs are named *_in1k (checked below against their scope).
IMAGENET = [p for p in CONFIGS if p.endswith('_in1k.py')]
DOWNSTREAM = [p for p in CONFIGS if 'embedded' not in p and p not in IMAGENET]


@pytest.mark.parametrize('path', DOWNSTREAM)
def test_default_weights_can_be_had(path):
    """A PaCa-ViT config fine-tunes from the release's ImageNet file of its
    variant, by URL; where the release has none (and for ClusTR, which has no
    release at all) from the local path an ImageNet config of ours writes,
    and the folder's README says so."""
    cfg = Config.fromfile(ROOT / path)
    assert cfg.default_scope != 'mmpretrain', path
    ckpt, backbone = cfg.imagenet_checkpoint, cfg.model.backbone
    expected = None
    if backbone.type == 'PaCaViT' and release_variant(backbone):
        expected = f'IMNET_224_pacavit_{release_variant(backbone)}.pth'
    if expected in RELEASE_FILES:
        assert ckpt == RELEASE + expected, path
        return
    assert not ckpt.startswith(('http://', 'https://')), ckpt
    made_by = re.fullmatch(r'work_dirs/([\w.-]+)/epoch_300\.pth', ckpt)
    assert made_by, f'{path}: {ckpt} is not what tools/train.py writes'
    source = list((ROOT / 'configs').glob(f'*/{made_by[1]}.py'))
    assert len(source) == 1, f'no config writes {ckpt}'
    source = Config.fromfile(source[0])
    assert source.default_scope == 'mmpretrain'
    for key in ('type', 'arch', 'clustering', 'clustering_interval'):
        assert source.model.backbone.get(key) == backbone.get(key), key
    readme = (ROOT / Path(path).parent / 'README.md').read_text()
    assert ckpt in readme, f'{ckpt} is not documented in the README'


@pytest.mark.parametrize('path', IMAGENET)
def test_imagenet_configs_train_from_scratch(path):
    cfg = Config.fromfile(ROOT / path)
    assert cfg.default_scope == 'mmpretrain', path
    assert not cfg.model.backbone.get('init_cfg'), path
    assert not cfg.get('load_from'), path


def test_release_naming_matches_every_paca_file():
    """Each release file is reproduced by one config, except the PaCa-head
    segmentors (configs/paca/pacahead_*) and their ablations."""
    made = {release_file(Config.fromfile(ROOT / p)) for p in CONFIGS}
    missing = sorted(f for f in RELEASE_FILES - made
                     if 'pacahead' not in f and not re.match(
                         r'upernet_pacavit_small_p2cconv_(?!100_0)', f))
    assert not missing, missing

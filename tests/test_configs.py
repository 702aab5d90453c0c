"""Every shipped config loads, builds with its library, and has the size the
papers report for it."""
import importlib
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

"""The fine-tune chain: an mmpretrain run's checkpoint initialises the
backbone of a downstream model through ``init_cfg`` exactly, and a wrong path
or prefix fails loudly instead of training from scratch."""
import copy

import pytest
import torch
from conftest import ROOT
from mmengine.config import Config
from mmengine.runner import Runner

import clustr_mm  # noqa: F401

DOWNSTREAM = {
    'mmdet': 'configs/clustr/mask-rcnn_clustr-t_fpn_embedded-coco.py',
    'mmseg': 'configs/clustr/fpn_clustr-t_embedded-ade20k.py',
    'mmpose': 'configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py',
}


@pytest.fixture(scope='module')
def imagenet_checkpoint(short_run):
    """The session's one-epoch tools/train.py run of the embedded ClusTR-T
    classifier (conftest.SHORT_RUN)."""
    return short_run('configs/clustr/clustr-t_embedded-imagenet.py')[1]


def _runner(config, init_cfg, work_dir):
    cfg = Config.fromfile(ROOT / config)
    cfg.model.backbone.init_cfg = init_cfg
    cfg.work_dir = str(work_dir)
    return Runner.from_cfg(cfg)


@pytest.mark.slow  # the checkpoint comes from tools/train.py
@pytest.mark.parametrize('library', sorted(DOWNSTREAM))
def test_backbone_equals_classifier_after_runner_init(
        library, imagenet_checkpoint, tmp_path):
    runner = _runner(DOWNSTREAM[library], dict(
        type='Pretrained', checkpoint=imagenet_checkpoint,
        prefix='backbone.'), tmp_path)
    before = copy.deepcopy(runner.model.backbone.state_dict())
    runner._init_model_weights()  # what runner.train() does first
    source = torch.load(imagenet_checkpoint, map_location='cpu')['state_dict']
    loaded = runner.model.backbone.state_dict()
    assert set(loaded) == {k[len('backbone.'):] for k in source
                           if k.startswith('backbone.')}
    for key, value in loaded.items():
        assert torch.equal(value, source['backbone.' + key]), key
    # The weights really changed (not equal by accident of init).
    assert any(not torch.equal(before[k], loaded[k]) for k in loaded)


@pytest.mark.slow
def test_wrong_prefix_fails_loudly(imagenet_checkpoint, tmp_path):
    runner = _runner(DOWNSTREAM['mmdet'], dict(
        type='Pretrained', checkpoint=imagenet_checkpoint, prefix='model.'),
        tmp_path)
    with pytest.raises((AssertionError, RuntimeError, KeyError),
                       match='model.'):
        runner._init_model_weights()


def test_missing_checkpoint_fails_loudly(tmp_path):
    runner = _runner(DOWNSTREAM['mmseg'], dict(
        type='Pretrained', checkpoint=str(tmp_path / 'nope.pth'),
        prefix='backbone.'), tmp_path)
    with pytest.raises(FileNotFoundError, match='nope.pth'):
        runner._init_model_weights()

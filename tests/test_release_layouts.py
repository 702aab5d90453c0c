"""The 38 official PaCa-ViT release files meet our configs, key for key.

The layouts come from tests/data/paca_release_keys.json (every key and shape
of the official model each file was saved from, built from the official
code), not from our own key map: for every file, the config our metafile
names for it is built, the file's keys go through the loader's converter
(clustr_mm/checkpoints/paca_official.py), and each must land on a key of
our model with the same shape, leaving none of our backbone's keys unfilled.
A few files are also written with random values and loaded through the
config's own weight path, tensor by tensor.
"""
import hashlib
import importlib
import re
from contextlib import contextmanager

import pytest
import torch
from conftest import TRAINING_DATA, load_config
from mmengine.registry import DefaultScope
from release_manifest import (MANIFEST, RELEASE, metafile_configs,
                              official_shapes, official_state)
from test_configs import RELEASE_FILES, release_file
from test_paca import to_official

import clustr_mm  # noqa: F401  (registers the models and the loader)
from clustr_mm.checkpoints import convert_checkpoint

NAMED = metafile_configs()


@contextmanager
def _scope(cfg):
    scope = cfg.default_scope
    importlib.import_module(f'{scope}.utils').register_all_modules(False)
    with DefaultScope.overwrite_default_scope(scope):
        yield importlib.import_module(f'{scope}.registry').MODELS


def our_state(cfg):
    """The state dict (meta tensors: shapes only) of what a release file
    fills in the config's model: the whole classifier (backbone and head),
    else the backbone under ``backbone.`` (necks and heads keep the mm
    libraries' names)."""
    with _scope(cfg) as registry, torch.device('meta'):
        if cfg.model.type == 'ImageClassifier':
            return registry.build(cfg.model).state_dict()
        backbone = registry.build(dict(cfg.model.backbone, init_cfg=None))
        return {f'backbone.{k}': v for k, v in backbone.state_dict().items()}


def our_shapes(cfg):
    return {k: tuple(v.shape) for k, v in our_state(cfg).items()}


def _weights(shapes):
    """The keys that are weights: the teacher's fixed blur kernels are not
    (the converter drops them and our teacher rebuilds them)."""
    return {k: v for k, v in shapes.items() if not k.endswith('blur_filter')}


def test_manifest_is_the_release():
    """The manifest lists the release's 38 files and our metafiles name a
    config for each one of them."""
    assert set(MANIFEST) == RELEASE_FILES
    assert len(MANIFEST) == 38
    assert sorted(NAMED) == sorted(MANIFEST)


@pytest.mark.torch21
@pytest.mark.parametrize('name', sorted(MANIFEST))
def test_release_file_fills_the_config_it_is_listed_on(name):
    path = NAMED[name]
    cfg = load_config(path)
    assert release_file(cfg) == name, path  # the release's naming agrees
    kwargs = MANIFEST[name].get('official_kwargs', {})
    if 'downstream_cluster_num' in kwargs:  # the official config's clusters
        assert list(cfg.model.backbone.num_clusters) == \
            kwargs['downstream_cluster_num'], path
    converted = convert_checkpoint(official_state(name, 'meta'),
                                        name)['state_dict']
    got = {k: tuple(v.shape) for k, v in converted.items()}
    ours = our_shapes(cfg)
    unfilled = sorted(set(ours) - set(got))
    unknown = sorted(set(got) - set(ours))
    assert not unfilled and not unknown, (
        f'{path}: {len(unfilled)} keys not filled by {name} '
        f'{unfilled[:5]}, {len(unknown)} converted keys not in the model '
        f'{unknown[:5]}')
    wrong = {k: (got[k], ours[k]) for k in ours if got[k] != ours[k]}
    assert not wrong, f'{path}: shapes differ (file, ours): {wrong}'
    assert len(got) == len(_weights(official_shapes(name)))  # one-to-one


@pytest.mark.parametrize('name', sorted(MANIFEST))
def test_the_tests_inverse_key_map_writes_the_release_layout(name):
    """tests/test_paca.py's ``to_official`` (our keys -> official ones, with
    which other tests write official-layout files from narrow models) gives
    exactly the keys and shapes of each release file's official model, so
    those files stand for the release's."""
    cfg = load_config(NAMED[name])
    state = our_state(cfg)
    backbone = {k[len('backbone.'):]: v for k, v in state.items()
                if k.startswith('backbone.')}
    official = to_official(backbone, cfg.model.backbone.get('clustering',
                                                            'conv'))
    made = {k: tuple(v.shape) for k, v in official.items()}
    expected = {k[len('backbone.'):] if k.startswith('backbone.') else k: v
                for k, v in official_shapes(name).items()
                if not k.startswith('head.')}
    assert made == expected, sorted(set(made) ^ set(expected))[:10]


def _imagenet_file(cfg):
    """The ImageNet release file a downstream config fine-tunes from, or
    None (a classifier the release does not have)."""
    ckpt = cfg.imagenet_checkpoint
    return ckpt[len(RELEASE):] if ckpt.startswith(RELEASE) else None


DOWNSTREAM = sorted(path for name, path in NAMED.items()
                    if not name.startswith('IMNET_'))


@pytest.mark.parametrize('path', DOWNSTREAM)
def test_downstream_config_starts_from_a_fitting_classifier(path):
    """The ImageNet file a release config fine-tunes from fills every key of
    its backbone; only the last layer of the clustering nets differs in
    shape (the segmentors' 200 clusters, re-initialised as in the official
    fine-tuning), and only in the number of clusters."""
    cfg = load_config(path)
    source = _imagenet_file(cfg)
    if source is None:  # a local path: its config is checked by test_configs
        assert not cfg.imagenet_checkpoint.startswith('http'), path
        return
    converted = convert_checkpoint(official_state(source, 'meta'),
                                        source)['state_dict']
    got = {k: tuple(v.shape) for k, v in converted.items()
           if k.startswith('backbone.')}
    ours = our_shapes(cfg)
    assert set(got) == set(ours), sorted(set(got) ^ set(ours))[:10]
    last = re.compile(r'.*(\.clustering\.(to_clusters|fc2)|'
                      r'\.teacher\.to_clusters\.\d)\.(weight|bias)$')
    for key, shape in ours.items():
        if got[key] != shape:
            assert last.match(key), (key, got[key], shape)
            assert got[key][1:] == shape[1:], (key, got[key], shape)
            assert TRAINING_DATA[path].startswith('ADE20K'), (
                f'{path}: {key} only a segmentor changes')


# --- files with random values, loaded the way the configs load them ---------
def _digest(tensor):
    return hashlib.sha1(tensor.detach().contiguous().numpy().tobytes()
                        ).hexdigest()


def assert_every_tensor_arrived(official, model_state):
    """Each tensor of ``model_state`` is bit for bit one of the official
    file's tensors, each official tensor used once: nothing left at its
    initial value, nothing loaded twice."""
    pool = {_digest(v): k for k, v in official.items()}
    assert len(pool) == len(official)  # random values: all distinct
    used = {}
    for key, value in model_state.items():
        match = pool.get(_digest(value))
        assert match is not None, f'{key} holds none of the file tensors'
        assert match not in used, f'{match} loaded into {used[match]} and {key}'
        used[match] = key
    assert len(used) == len(official), sorted(set(official) - set(used))[:5]


WRAPPED = {  # how the files are saved: timm's train.py, mm's runners
    'IMNET_224_pacavit_tiny_p2cconv_100_0.pth': 'timm',
    'IMNET_224_pacavit_convmixer_small_100.pth': 'raw',
    'mask_rcnn_pacavit_tiny_p2cconv_100_0_mstrain_480_800_1x_coco.pth': 'mm',
    'upernet_pacavit_small_p2cconv_100_blockwise_512x512_160k_ade20k.pth':
        'mm',
}


@pytest.mark.parametrize('name', sorted(WRAPPED))
def test_release_file_with_random_values_loads_through_the_config(
        name, tmp_path):
    """One file of each kind (timm classifier with its training script's
    entries, ConvMixer-teacher classifier, mmdet detector, mmseg PaCa-head
    segmentor with one clustering net per block), made from the manifest
    with random values, loads through a Pretrained init_cfg of the config
    listed for it (what fine-tuning and the tools use), every tensor in
    place."""
    torch.manual_seed(0)
    state = official_state(name, seed=1)
    file = tmp_path / name
    if WRAPPED[name] == 'timm':
        torch.save({'epoch': 299, 'state_dict': state, 'version': 2,
                    'optimizer': {'state': {}, 'param_groups': []}}, file)
    elif WRAPPED[name] == 'mm':
        torch.save({'meta': {'CLASSES': ('a', 'b')}, 'state_dict': state},
                   file)
    else:
        torch.save(state, file)
    cfg = load_config(NAMED[name])
    init = dict(type='Pretrained', checkpoint=str(file), prefix='backbone.')
    with _scope(cfg) as registry:
        backbone = registry.build(dict(cfg.model.backbone, init_cfg=init))
    backbone.init_weights()
    official = {k[len('backbone.'):] if k.startswith('backbone.') else k: v
                for k, v in _weights(state).items()
                if not k.startswith('head.')}
    assert_every_tensor_arrived(official, backbone.state_dict())

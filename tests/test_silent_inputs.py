"""Issue 30, "nothing silent, second round": bad or unusual inputs that used
to pass without a word (or failed without saying why) now get a message that
names the argument, the value and what is allowed; half precision runs.

Unit-level wherever the behaviour lives in a function; the tool-level checks
are batched into a few ``slow`` tests at the end."""
import importlib.util
import json
import re
import sys
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import MODELS

import clustr_mm  # noqa: F401
from clustr_mm.checkpoints.coverage_hook import (CheckpointCoverageHook,
                                                 PartialLoadError)
from clustr_mm.engine.data_checks import DataCheckError, check_data
from clustr_mm.engine.launch import check_train_length
from clustr_mm.engine.random_state_hook import RandomStateHook
from clustr_mm.engine.resume_settings_hook import (ResumeSettingsHook,
                                                   optimizer_overrides,
                                                   scheduler_overrides)
from clustr_mm.models.backbones.pretrained import load_backbone_state
from clustr_mm.models.layers import DPCKNN, ClusterAttention
from clustr_mm.models.layers.cluster_attention import SummaryAttention
from clustr_mm.models.layers.reducers import (CentroidAttention, GridPool,
                                              SoftCluster)
from clustr_mm.registry import skip_note

from conftest import ROOT, load_config, load_tool, run_tool

ARCH = dict(embed_dims=(8, 16, 32, 64), depths=(1, 1, 1, 1),
            num_heads=(1, 1, 2, 4), mlp_ratios=(2, 2, 2, 2))
BACKBONES = ('ClusTR', 'PaCaViT')


def build(name, arch=ARCH, **kwargs):
    return MODELS.build(dict(type=name, arch=arch, **kwargs))


def no_warnings(fn):
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        return fn()


# --- switches take bools only ------------------------------------------------
@pytest.mark.parametrize('name', BACKBONES)
@pytest.mark.parametrize('option', ['compact_qv', 'norm_eval', 'with_cp',
                                    'keep_assignments'])
@pytest.mark.parametrize('value', ['no', 'False', 1, None])
def test_backbone_switches_refuse_non_bools(name, option, value):
    # 'no' and 'False' are truthy: compact_qv='no' built the Armour variant,
    # norm_eval='False' froze every BatchNorm
    with pytest.raises(ValueError, match=re.escape(
            f'{option} must be True or False, got {value!r}')):
        build(name, **{option: value})


@pytest.mark.parametrize('make, option', [
    (lambda v: SummaryAttention(8, 2, qkv_bias=v), 'qkv_bias'),
    (lambda v: SummaryAttention(8, 2, summary_norm=v), 'summary_norm'),
    (lambda v: SummaryAttention(8, 2, compact_qv=v), 'compact_qv'),
    (lambda v: SummaryAttention(8, 2, token_weights=v), 'token_weights'),
    (lambda v: ClusterAttention(8, 2, 2, qkv_bias=v), 'qkv_bias'),
    (lambda v: CentroidAttention(8, sr_ratio=2, qkv_bias=v), 'qkv_bias'),
])
def test_reducer_and_attention_switches_refuse_non_bools(make, option):
    with pytest.raises(ValueError, match=f"{option} must be True or False, "
                       "got 'no'"):
        make('no')


# --- numbers are range-checked at build time ----------------------------------
@pytest.mark.parametrize('kwargs, message', [
    (dict(k=0), "k must be an int >= 2, got 0"),
    (dict(k=1), "k must be an int >= 2, got 1 (the kNN density counts"),
    (dict(k=-3), "k must be an int >= 2, got -3"),
    (dict(k=2.5), "k must be an int >= 2, got 2.5"),
    (dict(k=True), "k must be an int >= 2, got True"),
    (dict(scale_factors=()), "scale_factors must be a non-empty sequence of "
     "ints >= 1, got ()"),
    (dict(scale_factors=(1, 0)), "scale_factors must be a non-empty "
     "sequence of ints >= 1, got (1, 0)"),
    (dict(scale_factors=(1, -4)), "got (1, -4)"),
    (dict(scale_factors=(1.5, )), "got (1.5,)"),
    (dict(scale_factors=4), "got 4"),
    (dict(sr_ratio=0), "sr_ratio must be an int >= 1, got 0"),
    (dict(window_size=0), "window_size must be an int >= 1, got 0"),
    (dict(window_size=4.0), "window_size must be an int >= 1, got 4.0"),
    (dict(max_chunk_elems=0), "max_chunk_elems must be an int >= 1, got 0"),
])
def test_dpcknn_arguments_are_range_checked(kwargs, message):
    args = dict(dict(sr_ratio=2), **kwargs)
    with pytest.raises(ValueError, match=re.escape(message)):
        DPCKNN(**args)


def test_dpcknn_arguments_checked_when_the_backbone_is_built():
    # before: k=0 ran with a density of no neighbours, (0,) failed at the
    # first forward deep inside torch
    with pytest.raises(ValueError, match='k must be an int >= 2, got 0'):
        build('ClusTR', reducers=dict(type='DPCKNN', k=0))
    with pytest.raises(ValueError, match=r'scale_factors .* got \(\)'):
        build('PaCaViT', reducers=dict(type='DPCKNN', scale_factors=()))


@pytest.mark.parametrize('make, message', [
    (lambda: SoftCluster(16, 4, kernel_size=4), 'kernel_size must be odd'),
    (lambda: SoftCluster(16, 4, kernel_size=0),
     'kernel_size must be an int >= 1, got 0'),
    (lambda: SoftCluster(16, True), 'num_clusters must be an int >= 1, got '
     'True'),
    (lambda: SoftCluster(16, 4, net='mlp', mlp_ratio=0.01),
     r'mlp_ratio=0.01 gives a hidden width int\(16 \* 0.01\) = 0'),
    (lambda: GridPool(16, True), 'sr_ratio must be an int >= 1, got True'),
    (lambda: GridPool(16, 2, norm_eps=0), r'norm_eps must be a number in '
     r'\(0, inf\), got 0'),
    (lambda: CentroidAttention(16, sr_ratio=2, num_heads=0),
     'num_heads must be an int >= 1, got 0'),
    (lambda: CentroidAttention(16, sr_ratio=2, iters=True),
     'iters must be an int >= 1, got True'),
    (lambda: SummaryAttention(16, 2, proj_drop=1.5),
     r'proj_drop must be a number in \[0, 1\), got 1.5'),
])
def test_other_reducer_numbers_are_range_checked(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize('name', BACKBONES)
def test_mlp_ratio_rounding_a_hidden_width_to_zero_is_named(name):
    arch = dict(ARCH, mlp_ratios=(2, 0.1, 2, 2))  # int(16 * 0.1) = 1: fine
    build(name, arch)
    arch = dict(ARCH, mlp_ratios=(0.1, 2, 2, 2))  # int(8 * 0.1) = 0
    with pytest.raises(ValueError, match=re.escape(
            "arch mlp_ratios[0]=0.1 gives a hidden width int(8 * 0.1) = 0; "
            "it must be at least 1 (a ratio >= 0.125 for 8 channels)")):
        build(name, arch)


# --- arguments a configuration does not use ------------------------------------
def test_clustr_names_the_options_its_configuration_does_not_use():
    with pytest.warns(UserWarning, match=r"window_size=8 is not used: "
                      r"clustering_mode='exact' clusters whole images"):
        build('ClusTR', window_size=8)
    with pytest.warns(UserWarning, match='window_size=8 is not used: no '
                      'reducer of this model clusters in windows'):
        build('ClusTR', clustering_mode='window', window_size=8,
              reducers=dict(type='GridPool'))
    with pytest.warns(UserWarning, match='max_chunk_elems=4096 is not used'):
        build('ClusTR', max_chunk_elems=4096, reducers=dict(type='GridPool'))
    # what they are for: no word
    no_warnings(lambda: build('ClusTR'))
    no_warnings(lambda: build('ClusTR', clustering_mode='window',
                              window_size=8, max_chunk_elems=4096))


def test_paca_names_the_options_its_configuration_does_not_use():
    reducers = dict(type='GridPool')
    # before: built, the mlp net silently not used
    with pytest.raises(ValueError, match=r"clustering='mlp' is not used: "
                       'reducers gives every stage with clusters its own '
                       'reducer'):
        build('PaCaViT', clustering='mlp', reducers=reducers)
    # the default value, spelled out by a base config: a warning
    with pytest.warns(UserWarning, match="clustering='conv' is not used"):
        build('PaCaViT', clustering='conv', reducers=reducers)
    with pytest.warns(UserWarning, match='clustering_interval=1 is not used'):
        build('PaCaViT', clustering_interval=1, reducers=reducers)
    no_warnings(lambda: build('PaCaViT', reducers=reducers))
    no_warnings(lambda: build('PaCaViT', clustering='mlp'))
    # a stage left to the soft clustering (None in a clustered stage) uses it
    no_warnings(lambda: build('PaCaViT', clustering='mlp', num_clusters=(
        4, 4, 4, 0), reducers=[reducers, None, reducers, None]))


# --- half, bfloat16 and double precision -----------------------------------
# Relative L2 error of each stage's output against fp32, same weights and
# images. Measured (2-core CPU, torch 2.14.1, this test's models; ClusTR-T
# and PaCa-T alike): fp64 <= 1.3e-6, fp16 <= 4.4e-3, bf16 <= 1.1e-2.
TOLERANCE = {torch.float64: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


@pytest.mark.parametrize('name', BACKBONES)
@pytest.mark.parametrize('dtype', [torch.float64, torch.bfloat16,
                                   torch.float16], ids=str)
def test_backbones_run_in_the_model_dtype(name, dtype):
    # before: "mat1 and mat2 must have the same dtype" (ClusTR's clustering
    # handed fp32 tokens to layers in the model's dtype)
    torch.manual_seed(0)
    extra = dict(clustering_mode='window', window_size=8) if (
        name == 'ClusTR') else {}
    model = build(name, **extra)
    model.init_weights()
    model.eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        reference = model(x)
        outs = model.to(dtype)(x.to(dtype))
    for i, (out, ref) in enumerate(zip(outs, reference)):
        assert out.dtype == dtype
        error = ((out.double() - ref.double()).norm() / ref.double().norm())
        assert error < TOLERANCE[dtype], (i, float(error))


# --- checkpoints: both directions -------------------------------------------
def _classifier(depths):
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        return MODELS.build(dict(
            type='mmpretrain.ImageClassifier',
            backbone=dict(type='ClusTR', arch=dict(ARCH, depths=depths)),
            neck=dict(type='mmpretrain.GlobalAveragePooling'),
            head=dict(type='mmpretrain.LinearClsHead', num_classes=4,
                      in_channels=64)))


def _fake_runner(model, resume=False, **cfg):
    messages = []
    logger = SimpleNamespace(warning=messages.append)
    return SimpleNamespace(model=model, cfg=Config(cfg), logger=logger,
                           _resume=resume), messages


def test_a_deeper_models_checkpoint_is_refused():
    # a ClusTR-S-like checkpoint (more blocks) into a ClusTR-T-like model:
    # every model tensor is filled, so only the other direction shows it
    small, deeper = _classifier((1, 1, 1, 1)), _classifier((1, 2, 3, 1))
    runner, messages = _fake_runner(small, load_from='deeper.pth')
    checkpoint = dict(state_dict=deeper.state_dict())
    with pytest.raises(PartialLoadError) as error:
        CheckpointCoverageHook().after_load_checkpoint(runner, checkpoint)
    message = str(error.value)
    assert re.search(r'leaves 0 of \d+ tensors of ImageClassifier .*'
                     r'and 60 of its 162 checkpoint tensors are unused by '
                     r'the model \(backbone\.stages\.1\.blocks\.1\.', message)
    assert 'a larger model' in message and '--allow-partial-load' in message
    # allowed: a warning with the same counts
    runner, messages = _fake_runner(small, load_from='deeper.pth',
                                    allow_partial_load=True)
    CheckpointCoverageHook().after_load_checkpoint(runner, checkpoint)
    assert 'checkpoint tensors are unused' in messages[0]
    # its own checkpoint: no word
    runner, messages = _fake_runner(small, load_from='own.pth')
    CheckpointCoverageHook().after_load_checkpoint(
        runner, dict(state_dict=small.state_dict()))
    assert not messages


def test_a_model_level_pretrained_init_that_fills_little_is_refused(
        tmp_path):
    """Issue 39, item 8: MMEngine loads a Pretrained init_cfg of the model
    (or of a neck / head) with strict=False and trains from what it left
    random; the coverage hook refuses it after the init, before iteration 1:
    another model's file, a file whose weights sit under an unexpected
    top-level key."""
    from clustr_mm.models.backbones.paca import PaCaViT
    model = _classifier((1, 1, 1, 1))
    other = tmp_path / 'other.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in PaCaViT(
        dict(ARCH, num_heads=(1, 1, 2, 4))).state_dict().items()}}, other)
    wrapped = tmp_path / 'wrapped.pth'
    torch.save({'weights': model.state_dict()}, wrapped)
    own = tmp_path / 'own.pth'
    torch.save({'state_dict': model.state_dict()}, own)

    def check(path, **cfg):
        model.init_cfg = dict(type='Pretrained', checkpoint=str(path))
        runner, messages = _fake_runner(model, **cfg)
        CheckpointCoverageHook().before_train(runner)
        return messages

    with pytest.raises(PartialLoadError, match=re.escape(
            f'model.init_cfg Pretrained {other} leaves ')
            + r'.*To fine-tune one part of the model, give that part the '
            r'entry .*--allow-partial-load'):
        check(other)
    with pytest.raises(PartialLoadError, match=r"Its tensors sit under the "
                       r"top-level key\(s\) \['weights'\], which MMEngine "
                       r'does not look into'):
        check(wrapped)
    assert not check(own)
    assert 'Training from it anyway' in check(other, allow_partial_load=True)[0]
    assert not check(other, load_from=str(own))  # load_from replaces it


def test_backbone_pretrained_load_counts_both_directions():
    small = build('ClusTR')
    deeper = build('ClusTR', dict(ARCH, depths=(1, 2, 3, 1)))
    with pytest.warns(UserWarning, match=r'loaded \d+ of \d+ tensors; \d+ of '
                      r'the \d+ checkpoint tensors unused by the model '
                      r'\(stages\.1\.blocks\.1\.[\w.]+, [\w.]+, [\w.]+, '
                      r'\.\.\. \d+ more\)'):
        load_backbone_state(small, deeper.state_dict())
    with pytest.warns(UserWarning, match=r'\d+ model tensors missing in the '
                      r'checkpoint \(stages\.1\.blocks\.1\.'):
        load_backbone_state(deeper, small.state_dict())


# --- resume: what the checkpoint overrides --------------------------------------
def _optimizer_and_schedulers(lr, weight_decay, t_max):
    from mmengine.optim import CosineAnnealingLR, LinearLR
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr,
                                  weight_decay=weight_decay)
    schedulers = [LinearLR(optimizer, start_factor=0.1, end=4,
                           by_epoch=False),
                  CosineAnnealingLR(optimizer, T_max=t_max, eta_min=1e-5)]
    return optimizer, schedulers


def test_resume_names_every_setting_the_checkpoint_overrides():
    saved_opt, saved_sched = _optimizer_and_schedulers(1e-3, 0.05, 8)
    saved_opt.step()
    for s in saved_sched:
        s.step()
    saved = dict(optimizer=saved_opt.state_dict(),
                 param_schedulers=[s.state_dict() for s in saved_sched])
    optimizer, schedulers = _optimizer_and_schedulers(5e-4, 0.05, 12)
    lines = optimizer_overrides(optimizer.param_groups,
                                saved['optimizer']['param_groups'])
    assert lines == ['optimizer lr: 0.0005 in the config -> 0.001 from the '
                     'checkpoint']
    lines = scheduler_overrides(schedulers, saved['param_schedulers'])
    assert lines == ['param_scheduler[1] (CosineAnnealingLR) T_max: 12 in '
                     'the config -> 8 from the checkpoint']
    # through the hook, as tools/train.py --resume adds it
    wrapper = SimpleNamespace(optimizer=optimizer)
    runner, messages = _fake_runner(None, resume=True)
    runner.optim_wrapper, runner.param_schedulers = wrapper, schedulers
    ResumeSettingsHook().after_load_checkpoint(runner, saved)
    assert 'optimizer lr: 0.0005 in the config -> 0.001' in messages[0]
    assert 'T_max: 12' in messages[0] and 'load_from=PATH' in messages[0]
    # the same settings: no word; load_from (no resume): no word
    same_opt, same_sched = _optimizer_and_schedulers(1e-3, 0.05, 8)
    runner.optim_wrapper = SimpleNamespace(optimizer=same_opt)
    runner.param_schedulers = same_sched
    ResumeSettingsHook().after_load_checkpoint(runner, saved)
    runner._resume = False
    runner.optim_wrapper, runner.param_schedulers = wrapper, schedulers
    ResumeSettingsHook().after_load_checkpoint(runner, saved)
    assert len(messages) == 1


def test_rng_state_is_restored_and_missed_only_on_resume():
    runner, messages = _fake_runner(None, resume=False)
    RandomStateHook().after_load_checkpoint(runner, {})  # tools/test.py
    assert not messages
    runner._resume = True
    RandomStateHook().after_load_checkpoint(runner, {})
    assert 'has no rng_state' in messages[0]


def test_a_run_that_trains_nothing_is_refused():
    for key in ('max_epochs', 'max_iters'):
        for value in (0, -1, 2.5):
            with pytest.raises(ValueError, match=re.escape(
                    f'train_cfg.{key}={value!r}: nothing would be trained')):
                check_train_length(Config(dict(train_cfg={key: value})))
    check_train_length(Config(dict(train_cfg=dict(max_epochs=1))))


# --- CLUSTR_MM_SKIP is named in the errors it causes -----------------------------
def test_errors_caused_by_the_skip_switch_name_it(monkeypatch):
    official = {'patch_embed.proj.0.weight': torch.zeros(1),
                'stage1.0.attn.q.weight': torch.zeros(1)}
    model = build('PaCaViT')
    monkeypatch.setenv('CLUSTR_MM_SKIP', 'checkpoint_loaders')
    assert "CLUSTR_MM_SKIP='checkpoint_loaders' is set" in skip_note(
        'checkpoint_loaders')
    with pytest.raises(RuntimeError, match="CLUSTR_MM_SKIP='checkpoint_"
                       "loaders' is set, which leaves out clustr_mm's "
                       'checkpoint loader'):
        load_backbone_state(model, official)
    runner, _ = _fake_runner(model, load_from='official.pth')
    with pytest.raises(PartialLoadError, match='an official PaCa-ViT file '
                       "that was not converted. Note: CLUSTR_MM_SKIP="):
        CheckpointCoverageHook().after_load_checkpoint(runner, official)
    monkeypatch.delenv('CLUSTR_MM_SKIP')
    assert skip_note('checkpoint_loaders') == ''
    monkeypatch.setenv('CLUSTR_MM_SKIP', 'lazy_heads')
    assert 'PaCaSegHead' in skip_note('lazy_heads')


# --- data: caught before a run, naming the file and the value ----------------
def _jpeg(path, size=8):
    from PIL import Image
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.zeros((size, size, 3), np.uint8)).save(path)


def _imagenet_cfg(root, lines, num_classes=4):
    (root / 'meta').mkdir(parents=True, exist_ok=True)
    (root / 'meta' / 'train.txt').write_text(''.join(
        line + '\n' for line in lines))
    return Config(dict(
        default_scope='mmpretrain',
        model=dict(head=dict(num_classes=num_classes)),
        train_dataloader=dict(dataset=dict(
            type='ImageNet', data_root=str(root), ann_file='meta/train.txt',
            data_prefix='train'))))


def test_imagenet_list_problems_are_named(tmp_path):
    root = tmp_path / 'imagenet'
    _jpeg(root / 'train' / 'a.JPEG')
    _jpeg(root / 'train' / 'b.JPEG')
    check_data(_imagenet_cfg(root, ['a.JPEG 0', 'b.JPEG 3']),
               ['train_dataloader'])
    cases = [([], r'meta/train.txt lists no images \(an empty annotation '
              'list\\)'),
             (['a.JPEG 0', 'b.JPEG 4'], r'train.txt line 2: label 4 is outside '
              r'the 4 classes of the model \(0..3\)'),
             (['a.JPEG 0', 'c.JPEG 1'], r'1 of 2 images do not exist: .*'
              r'train/c.JPEG')]
    for lines, message in cases:
        with pytest.raises(DataCheckError, match=message):
            check_data(_imagenet_cfg(root, lines), ['train_dataloader'])
    # ImageNet by split (meta/train.txt, train/), as the shipped configs
    cfg = _imagenet_cfg(root, ['a.JPEG 0', 'b.JPEG 1000'], num_classes=1000)
    cfg.train_dataloader.dataset = dict(type='ImageNet', data_root=str(root),
                                        split='train')
    with pytest.raises(DataCheckError, match='label 1000 is outside the 1000 '
                       r'classes of the model \(0..999\)'):
        check_data(cfg, ['train_dataloader'])
    (root / 'train' / 'empty.JPEG').write_bytes(b'')
    with pytest.raises(DataCheckError, match=r'1 of 2 images are empty '
                       r'\(0 bytes\): .*train/empty.JPEG'):
        check_data(_imagenet_cfg(root, ['a.JPEG 0', 'empty.JPEG 1']),
                   ['train_dataloader'])


def test_coco_without_annotations_is_named(tmp_path):
    _jpeg(tmp_path / 'train2017' / '1.jpg')
    ann = tmp_path / 'instances_train2017.json'
    ann.write_text(json.dumps(dict(
        images=[dict(id=1, file_name='1.jpg', width=8, height=8)],
        annotations=[], categories=[dict(id=1, name='a')])))
    cfg = Config(dict(default_scope='mmdet', train_dataloader=dict(
        dataset=dict(type='CocoDataset', data_root=str(tmp_path),
                     ann_file=ann.name, data_prefix=dict(img='train2017/')))))
    with pytest.raises(DataCheckError, match=r'instances_train2017.json has no '
                       r'annotations \(1 images, 0 annotations\)'):
        check_data(cfg, ['train_dataloader'])
    cfg.train_dataloader.dataset.test_mode = True  # e.g. test-dev: allowed
    check_data(cfg, ['train_dataloader'])


def test_ade20k_label_beyond_the_classes_is_named(tmp_path):
    from PIL import Image
    labels = tmp_path / 'annotations' / 'training'
    labels.mkdir(parents=True)
    label = np.zeros((8, 8), np.uint8)
    label[0, 0] = 150  # class 149 after reduce_zero_label: the last one
    Image.fromarray(label).save(labels / 'a.png')
    cfg = Config(dict(
        default_scope='mmseg', model=dict(decode_head=dict(num_classes=150)),
        train_dataloader=dict(dataset=dict(
            type='ADE20KDataset', data_root=str(tmp_path),
            data_prefix=dict(img_path='images/training',
                             seg_map_path='annotations/training'),
            pipeline=[dict(type='LoadAnnotations', reduce_zero_label=True)]))))
    check_data(cfg, ['train_dataloader'])
    label[1, 1] = 151
    Image.fromarray(label).save(labels / 'b.png')
    with pytest.raises(DataCheckError, match=r'b.png: label value\(s\) \[151\] '
                       r'beyond the 150 classes of the model \(stored values '
                       r'1..150 \(0 is ignored: reduce_zero_label\), 255 '
                       r'ignored\)'):
        check_data(cfg, ['train_dataloader'])


# --- pose data: checked like detection data (issue 39, item 2) ----------------
POSE = 'configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py'
WHOLE_BODY = (('keypoints', 17), ('foot_kpts', 6), ('face_kpts', 68),
              ('lefthand_kpts', 21), ('righthand_kpts', 21))


def _person(box=(1.0, 1.0, 5.0, 6.0), visible=2, arrays=WHOLE_BODY):
    person = dict(id=7, image_id=1, category_id=1, iscrowd=0,
                  bbox=list(box), num_keypoints=17 if visible else 0)
    for field, count in arrays:
        person[field] = [3.0, 3.0, visible] * count
    return person


def _pose_cfg(tmp_path, person, **model):
    _jpeg(tmp_path / 'train2017' / '1.jpg')
    ann = tmp_path / 'wholebody.json'
    ann.write_text(json.dumps(dict(
        images=[dict(id=1, file_name='1.jpg', width=8, height=8)],
        annotations=[person], categories=[dict(id=1, name='person')])))
    cfg = load_config(POSE)
    cfg.train_dataloader.dataset.update(
        data_root=str(tmp_path) + '/', ann_file=ann.name)
    cfg.model.head.update(model)
    return cfg


@pytest.mark.parametrize('person, message', [
    (_person(box=(1.0, 1.0, float('nan'), 6.0)),
     r'annotation id 7: bbox \[1.0, 1.0, nan, 6.0\] is not finite; mmpose '
     r'would train this person with every target weight 0'),
    (_person(box=(1.0, 1.0, -4.0, 6.0)), r'annotation id 7: bbox .* has width x height -4.0 x 6.0'),
    (_person(box=(1.0, 1.0, 0.0, 0.0)), r'annotation id 7: bbox .* has width x height 0.0 x 0.0'),
    (_person(visible=0), r'none of its 1 people is one mmpose trains on: 0 '
     r'are crowd \(iscrowd 1\), 1 have no visible keypoint .* nothing to '
     r'train on'),
    (dict(_person(), iscrowd=1), r'none of its 1 people .*: 1 are crowd'),
    (_person(arrays=WHOLE_BODY[:1]), r"annotation id 7 has no 'foot_kpts': "
     r'a CocoWholeBodyDataset person has keypoints, foot_kpts, face_kpts, '
     r'lefthand_kpts, righthand_kpts \(133 keypoints\); a file with 17 '
     r'keypoints per person belongs to another dataset type'),
    (dict(_person(), face_kpts=[0.0] * 9), r'annotation id 7: face_kpts has 9 values, a '
     r'CocoWholeBodyDataset file 204'),
])
def test_pose_annotations_are_checked(tmp_path, person, message):
    cfg = _pose_cfg(tmp_path, person)
    with pytest.raises(DataCheckError, match='wholebody.json: ' + message):
        check_data(cfg, ['train_dataloader'])


def test_pose_file_that_fits_passes(tmp_path):
    check_data(_pose_cfg(tmp_path, _person()), ['train_dataloader'])


@pytest.mark.parametrize('head, message', [
    (dict(out_channels=17), r'model.head.out_channels=17, but '
     r'CocoWholeBodyDataset has 133 keypoints'),
    (dict(decoder=dict(type='MSRAHeatmap', input_size=(48, 64),
                       heatmap_size=(24, 32), sigma=1)),
     r'codec: heatmap_size \(24, 32\) is not input_size \(48, 64\) / 4 = '
     r'\(12, 16\), the size of the maps the model predicts \(backbone '
     r'stride 4, 0 2x deconvolutions in the head\)'),
    (dict(decoder=dict(type='MSRAHeatmap', input_size=(48, 64),
                       heatmap_size=(12, 16), sigma=1),
          deconv_out_channels=(8,), deconv_kernel_sizes=(4,)),
     r'heatmap_size \(12, 16\) is not input_size \(48, 64\) / 2 = '
     r'\(24, 32\)'),
])
def test_pose_head_must_fit_the_data_and_the_codec(tmp_path, head, message):
    cfg = _pose_cfg(tmp_path, _person(), **head)
    with pytest.raises(DataCheckError, match=message):
        check_data(cfg, ['train_dataloader'])


def test_every_shipped_pose_config_passes_the_model_check():
    from clustr_mm.engine.data_checks import check_pose_model
    from conftest import MODEL_CONFIGS
    pose = [p for p in MODEL_CONFIGS if load_config(p).default_scope ==
            'mmpose']
    assert len(pose) >= 8
    for path in pose:
        cfg = load_config(path)
        check_pose_model(cfg, cfg.train_dataloader.dataset)


# --- a run that cannot learn stops (issue 39, item 1) -------------------------
def _runner(dataset_len=4, max_iters=100, model=None, lr=0.1):
    model = model or torch.nn.Linear(2, 2)
    return SimpleNamespace(
        max_iters=max_iters, model=model,
        optim_wrapper=SimpleNamespace(param_groups=torch.optim.SGD(
            model.parameters(), lr=lr).param_groups),
        train_dataloader=SimpleNamespace(dataset=[0] * dataset_len),
        cfg=Config(dict(train_dataloader=dict(dataset=dict(
            type='RepeatDataset', dataset=dict(
                type='CocoWholeBodyDataset', data_root='data/coco/',
                ann_file='annotations/x.json'))))))


def test_a_loss_of_exactly_zero_from_the_start_stops_the_run():
    from clustr_mm.engine.fail_fast_hook import (CannotLearnError,
                                                 FailFastHook)
    zero = {'loss_kpt': torch.tensor(0.0), 'acc_pose': torch.tensor(0.0)}
    hook, runner = FailFastHook(zero_loss_iters=3), _runner()
    hook.after_train_iter(runner, 0, outputs=zero)
    hook.after_train_iter(runner, 1, outputs=zero)
    with pytest.raises(CannotLearnError, match=re.escape(
            'the loss was exactly 0 in each of the first 3 iterations (3 '
            'iterations): nothing is learned and nothing was saved. Every '
            'target weighs 0; check the training annotations '
            'data/coco/annotations/x.json (CocoWholeBodyDataset)')):
        hook.after_train_iter(runner, 2, outputs=zero)
    # a run shorter than the window, and the end of a short first epoch
    hook, runner = FailFastHook(), _runner(max_iters=2)
    hook.after_train_iter(runner, 0, outputs=zero)
    with pytest.raises(CannotLearnError, match='first 2 iterations'):
        hook.after_train_iter(runner, 1, outputs=zero)
    hook, runner = FailFastHook(), _runner()
    hook.after_train_iter(runner, 0, outputs=zero)
    with pytest.raises(CannotLearnError, match='every iteration of the first '
                       'epoch'):
        hook.after_train_epoch(runner)
    # one non-zero loss and the check is done; 0 turns it off
    hook = FailFastHook(zero_loss_iters=2)
    hook.after_train_iter(runner, 0, outputs={
        'loss_kpt': torch.tensor(0.5)})
    for i in range(5):
        hook.after_train_iter(runner, i + 1, outputs=zero)
    hook.after_train_epoch(runner)
    hook = FailFastHook(zero_loss_iters=0)
    for i in range(5):
        hook.after_train_iter(runner, i, outputs=zero)
    for bad in (-1, 2.5, True, '10'):
        with pytest.raises(ValueError, match='zero_loss_iters must be an int'):
            FailFastHook(zero_loss_iters=bad)


def test_a_model_with_nothing_to_train_stops_the_run():
    from clustr_mm.engine.fail_fast_hook import (CannotLearnError,
                                                 FailFastHook)
    model = torch.nn.Linear(2, 2)
    FailFastHook().before_train(_runner(model=model))
    with pytest.raises(CannotLearnError, match='every parameter group '
                       'trains with a learning rate of 0'):
        FailFastHook().before_train(_runner(model=model, lr=0.0))
    model.requires_grad_(False)
    with pytest.raises(CannotLearnError, match='no parameter of the model '
                       'requires a gradient'):
        FailFastHook().before_train(_runner(model=model))


def test_an_empty_training_set_stops_the_run():
    from clustr_mm.engine.fail_fast_hook import (CannotLearnError,
                                                 FailFastHook)
    FailFastHook().before_train(_runner(dataset_len=3))
    with pytest.raises(CannotLearnError, match=re.escape(
            'the training set is empty: data/coco/annotations/x.json '
            '(CocoWholeBodyDataset) keeps 0 entries after its filters')):
        FailFastHook().before_train(_runner(dataset_len=0))


@pytest.mark.slow
def test_pose_runs_that_cannot_learn_stop(tiny_data, tmp_path):
    """The issue's run (every box width NaN: it trained with loss 0, saved
    and exited 0) and a file of crowd people only (mmpose filtered every one,
    then failed with 'need at least one array to concatenate') are refused
    before training; a loss weighted 0 stops within the first iterations.
    Nothing is saved."""
    source = json.loads((tiny_data / 'coco/annotations/'
                         'coco_wholebody_train_v1.0.json').read_text())

    def train(name, annotations, *options):
        ann = tmp_path / f'{name}.json'
        ann.write_text(json.dumps(dict(source, annotations=annotations)))
        work = tmp_path / name
        out = run_tool(['tools/train.py', POSE, '--work-dir', str(work),
                        '--cfg-options', f'train_dataloader.dataset.'
                        f'ann_file={ann}', *options], check=False)
        assert out.returncode != 0, out.stdout[-3000:]
        assert not list(work.glob('*.pth')), 'a checkpoint was saved'
        return out.stdout

    nan = [dict(a, bbox=[a['bbox'][0], a['bbox'][1], float('nan'),
                         a['bbox'][3]]) for a in source['annotations']]
    assert re.search(r'nan\.json: annotation id \d+: bbox .* is not finite',
                     train('nan', nan))
    crowd = [dict(a, iscrowd=1) for a in source['annotations']]
    assert re.search(r'crowd\.json: none of its \d+ people is one mmpose '
                     r'trains on: \d+ are crowd', train('crowd', crowd))
    out = train('weightless', source['annotations'],
                'model.head.loss.loss_weight=0.0')
    assert re.search(r'the loss was exactly 0 in (each of the first \d+|'
                     r'every) iteration', out), out[-3000:]


# --- mixed precision: mmcv's fp32-only CPU ops -------------------------------------
def test_cpu_amp_lets_mmcv_nms_and_roi_align_take_bf16():
    ops = pytest.importorskip('mmcv.ops')
    from clustr_mm.engine.amp import install_cpu_amp_op_casts
    torch.manual_seed(0)
    xy = torch.rand(20, 2) * 50
    boxes = torch.cat([xy, xy + 10 + torch.rand(20, 2) * 20], 1)
    scores = torch.rand(20)
    expected = ops.nms(boxes, scores, 0.5)[1]
    install_cpu_amp_op_casts()
    dets, keep = ops.nms(boxes.bfloat16(), scores.bfloat16(), 0.5)
    assert dets.dtype == torch.bfloat16
    # bf16 boxes are rounded: the kept set may differ only at near-ties
    assert len(set(keep.tolist()) ^ set(expected.tolist())) <= 2
    feats = torch.randn(1, 4, 16, 16, requires_grad=True)
    rois = torch.tensor([[0., 1., 1., 9., 9.]])
    align = ops.RoIAlign((2, 2), 1.0, 2)
    half = feats.detach().bfloat16().requires_grad_()
    out = align(half, rois.bfloat16())
    # in the features' dtype: mmdet's RoI extractor writes it into a buffer
    # of that dtype (an fp32 result failed there under --amp)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), align(feats, rois), atol=0.05)
    out.float().sum().backward()
    assert half.grad is not None and half.grad.dtype == torch.bfloat16
    align(feats, rois).sum().backward()
    assert torch.allclose(half.grad.float(), feats.grad, atol=0.02)


# --- tools: arguments refused before anything runs -------------------------------
def _refused(capsys, call, *needles):
    with pytest.raises(SystemExit) as stop:
        call()
    text = f'{stop.value.code}\n{capsys.readouterr().err}'
    assert stop.value.code not in (0, None), text
    for needle in needles:
        assert needle in text, text


CONFIG = 'configs/clustr/clustr-t_embedded-imagenet.py'


def test_tool_arguments_are_refused_when_read(capsys, tmp_path, monkeypatch):

    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / 'tools' / 'analysis'))
    speed = load_tool('train_speed')
    _refused(capsys, lambda: speed.main([CONFIG, '--batch', '0']),
             "argument --batch: must be an int >= 1, got '0'")
    _refused(capsys, lambda: speed.main([CONFIG, '--out', str(tmp_path)]),
             f"argument --out: {str(tmp_path)!r} is a directory; give a "
             'file name in it')
    draw = load_tool('visualize_clusters')
    image = tmp_path / 'a.png'
    _jpeg(image)
    base = [CONFIG, '--image', str(image)]
    _refused(capsys, lambda: draw.parse_args(
        base + ['--out', 'x.png', '--num-heatmaps', '-3']),
        "argument --num-heatmaps: must be an int >= 0, got '-3'")
    _refused(capsys, lambda: draw.parse_args(base + ['--out', str(tmp_path)]),
             f"argument --out: {str(tmp_path)!r} is a directory")
    precision = load_tool('precision_check')
    _refused(capsys, lambda: precision.main(['--data', '/no/such/dir']),
             "argument --data: '/no/such/dir' does not exist")
    bench = load_tool('benchmark')
    _refused(capsys, lambda: bench.parse_args(['--threads', '0']),
             '--threads must be an int >= 1', 'got 0')
    _refused(capsys, lambda: bench.parse_args(
        ['--max-size', 'nosuchmodel=64']),
        "--max-size nosuchmodel=64: unknown model 'nosuchmodel'; the models "
        'are ', 'clustr-t')
    flops = load_tool('get_flops')
    _refused(capsys, lambda: flops.main([CONFIG, '--shape', '0']),
             "argument --shape: must be an int >= 1, got '0'")
    # numbers, each refused by name (issue 39, item 5)
    soak = load_tool('memory_soak')
    _refused(capsys, lambda: soak.main([CONFIG, '--warmup=-3']),
             "argument --warmup: must be an int >= 0, got '-3'")
    _refused(capsys, lambda: soak.main([CONFIG, '--max-growth-mb', 'nan']),
             "argument --max-growth-mb: must be a finite number > 0, got "
             "'nan'")
    _refused(capsys, lambda: soak.main([CONFIG, '--iters', '10', '--warmup',
                                        '5', '--window', '5']),
             '--iters 10 is too few for --warmup 5 and two --window of 5')
    _refused(capsys, lambda: load_tool('nan_check').main(
        [CONFIG, '--iters', '0']), "argument --iters: must be an int >= 1")
    _refused(capsys, lambda: load_tool('learning_check').main(
        [CONFIG, '--metric', 'x', '--min-gain=-inf']),
        "argument --min-gain: must be a finite number >= 0, got '-inf'")
    _refused(capsys, lambda: bench.parse_args(['--timeout', '0']),
             "argument --timeout: must be an int >= 1, got '0'")
    _refused(capsys, lambda: load_tool('plot_benchmark').main(
        ['r.json', '--out', 'p.png', '--fit-from', 'nan']),
        "argument --fit-from: must be a finite number > 0, got nan")
    _refused(capsys, lambda: draw.parse_args(
        base + ['--out', 'x.png', '--stages=-1']),
        "argument --stages: must be an int >= 0, got '-1'")
    export = load_tool('pytorch2onnx', 'deployment')
    for args, needle in [(['--shape', '0', '64'], "argument --shape"),
                         (['--shape', '64', '64', '--tol', '0'],
                          "argument --tol: must be a finite number > 0"),
                         (['--shape', '64', '64', '--batch=-1'],
                          "argument --batch: must be an int >= 1")]:
        _refused(capsys, lambda: export.parse_args([CONFIG, *args]), needle)
    deploy = load_tool('mmdeploy_detection', 'deployment')
    for args, needle in [(['--noise-draws', '0'], 'argument --noise-draws: '
                          "must be an int >= 1, got '0'"),
                         (['--box-tol', 'nan'], 'argument --box-tol: must be '
                          'a finite number > 0'),
                         (['--noise=-1e-5'], 'argument --noise: must be a '
                          'finite number >= 0')]:
        _refused(capsys, lambda: deploy.main(
            [CONFIG, '--deploy-cfg', 'd.py', *args]), needle)


def test_clustr_converter_names_an_official_paca_file(tmp_path, monkeypatch,
                                                      capsys):
    sys.path.insert(0, str(ROOT / 'tools' / 'model_converters'))
    try:
        import clustr_official_to_mm as converter
    finally:
        sys.path.pop(0)
    official = tmp_path / 'IMNET_224_pacavit_tiny_p2cconv_100_0.pth'
    torch.save({'model': {'patch_embed.proj.0.weight': torch.zeros(2),
                          'stage1.0.attn.q.weight': torch.zeros(2)}}, official)
    monkeypatch.setattr(sys, 'argv', ['x', str(official),
                                      str(tmp_path / 'out.pth')])
    # before: "is already a clustr_mm checkpoint" (it was converted on load)
    _refused(capsys, converter.main, 'is an official PaCa-ViT checkpoint '
             '(timm ImageNet classifier layout), not a ClusTR one',
             'paca_official_to_mm.py')


def test_a_config_path_in_a_library_that_does_not_exist_is_named(tmp_path):
    from clustr_mm.engine.launch import load_config
    config = tmp_path / 'c.py'
    config.write_text("_base_ = ['mmpretrain::no/such/config.py']\n")
    args = SimpleNamespace(config=str(config), cfg_options={},
                           launcher='none', work_dir=None, local_rank=0)
    with pytest.raises(FileNotFoundError, match=re.escape(
            "mmpretrain::no/such/config.py")):
        load_config(args)


def test_a_task_library_that_does_not_import_is_named(monkeypatch):
    """Seen on a GPU node without mmpretrain's `modelindex`: tools/train.py
    ended on "UniversalVisualizer is not in the mmengine::visualizer
    registry" after MMEngine's 'mmpretrain is not installed' warning."""
    from clustr_mm.engine.launch import load_config
    from clustr_mm.env_check import UnsupportedEnvironmentError
    monkeypatch.setitem(sys.modules, 'mmpretrain.utils', None)
    config = ROOT / 'configs' / 'paca' / 'paca-t_embedded-imagenet.py'
    args = SimpleNamespace(config=str(config), cfg_options={},
                           launcher='none', work_dir=None, local_rank=0)
    with pytest.raises(UnsupportedEnvironmentError,
                       match="mmpretrain .* is installed but does not import"):
        load_config(args)


# --- the tools themselves, in one batch -----------------------------------------
@pytest.mark.slow
def test_tools_refuse_what_used_to_pass_silently(tiny_data, tmp_path):
    """One short training run and five refusals (about a minute): a changed
    learning rate on --resume is named; a deeper model's classifier into
    tools/test.py is refused; max_epochs=0 is refused; dist_train.sh without
    a process count is refused; so is a model-level Pretrained init with that
    deeper model's weights."""
    base = ['--work-dir', str(tmp_path), '--cfg-options',
            'train_cfg.val_interval=100', 'default_hooks.checkpoint.interval=1']
    run_tool(['tools/train.py', CONFIG, *base, 'train_cfg.max_epochs=1'])
    out = run_tool(['tools/train.py', CONFIG, '--resume', *base,
                    'train_cfg.max_epochs=2',
                    'optim_wrapper.optimizer.lr=0.0005']).stdout
    assert re.search(r'optimizer lr: 0\.0005 in the config -> 0\.001 from '
                     r'the checkpoint', out), out[-3000:]
    # a ClusTR-S classifier (the case) into the ClusTR-T config
    cfg = Config.fromfile(str(ROOT / CONFIG))
    cfg.model.backbone.arch = 'small'
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmpretrain'):
        small = MODELS.build(cfg.model)
    ckpt = tmp_path / 'clustr-s.pth'
    torch.save({'state_dict': small.state_dict(), 'meta': {}}, ckpt)
    out = run_tool(['tools/test.py', CONFIG, str(ckpt), '--work-dir',
                    str(tmp_path / 'test')], check=False)
    assert out.returncode != 0, out.stdout[-3000:]
    assert re.search(r'leaves 0 of \d+ tensors .* and \d+ of its \d+ '
                     r'checkpoint tensors are unused by the model',
                     out.stdout), out.stdout[-3000:]
    assert 'accuracy/top1' not in out.stdout  # nothing was evaluated
    out = run_tool(['tools/train.py', CONFIG, '--work-dir',
                    str(tmp_path / 'zero'), '--cfg-options',
                    'train_cfg.max_epochs=0'], check=False)
    assert out.returncode != 0 and ('train_cfg.max_epochs=0: nothing would '
                                    'be trained') in out.stdout
    out = run_tool(['bash', 'tools/dist_train.sh', CONFIG], check=False,
                   python=False)
    assert out.returncode == 2 and 'NPROC' in out.stdout
    # a model-level Pretrained init with another model's weights (item 8)
    init = tmp_path / 'pretrained_init.py'
    init.write_text(f"_base_ = '{ROOT / CONFIG}'\nmodel = dict(init_cfg=dict("
                    f"_delete_=True, type='Pretrained', checkpoint='{ckpt}'))\n")
    out = run_tool(['tools/train.py', str(init), '--work-dir',
                    str(tmp_path / 'init')], check=False)
    assert out.returncode != 0, out.stdout[-3000:]
    assert f'model.init_cfg Pretrained {ckpt} leaves' in out.stdout
    assert not list((tmp_path / 'init').glob('*.pth'))


def test_tools_name_the_real_problem(tmp_path, monkeypatch, capsys):
    """Issue 39, item 6: a library's unrelated error is replaced by what
    is wrong: another model family's weights given to the exporter (it
    printed one raw 'size mismatch' line per tensor), a library config
    that does not exist (MMEngine's 'please specify the package name'),
    mmdeploy absent from the default environment."""
    monkeypatch.chdir(ROOT)
    export = load_tool('pytorch2onnx', 'deployment')
    from clustr_mm.models.backbones.paca import PaCaViT
    torch.manual_seed(0)
    weights = tmp_path / 'paca.pth'
    torch.save({'state_dict': {f'backbone.{k}': v for k, v in PaCaViT(
        'tiny').state_dict().items()}}, weights)
    model, _ = export.build_model(load_config(
        'configs/clustr/clustr-t_embedded-imagenet.py'))
    with pytest.raises(export.ExportError, match=r'does not fit the exported '
                       r'backbone: .* of another shape .*: is it the weights '
                       'of this config'):
        export.load_weights(model.backbone, str(weights), backbone=True)
    speed = load_tool('train_speed')
    with pytest.raises(SystemExit, match=r"mmpretrain::nope.py: mmpretrain "
                       r"has no config 'nope.py' \(looked in .*configs"):
        speed.load('mmpretrain::nope.py')
    with pytest.raises(SystemExit, match="no installed library 'nolib'"):
        speed.load('nolib::x/y.py')
    if importlib.util.find_spec('mmdeploy') is None:
        deploy = load_tool('mmdeploy_detection', 'deployment')
        with pytest.raises(SystemExit, match=r'needs mmdeploy .*'
                           r'setup_mmdeploy_env\.sh'):
            deploy.main(['configs/paca/mask-rcnn_paca-t_fpn_embedded-coco.py',
                         '--deploy-cfg', 'configs/deploy/'
                         'mask-rcnn_onnxruntime_static-256x256.py',
                         '--images', 'README.md'])


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU refusal; a '
                    'GPU trains pose configs with fp16 --amp')
def test_cpu_amp_refuses_pose_configs_by_name():
    """Issue 39, item 3: bf16 --amp on a CPU failed inside mmpose's heatmap
    head (`Got unsupported ScalarType BFloat16`, its accuracy goes through
    numpy); it is now refused when the config is read, for tools/train.py
    and nan_check.py alike (both call use_amp). Other task families still
    switch (tests/test_tools.py trains them)."""
    from clustr_mm.engine.amp import use_amp
    cfg = load_config('configs/clustr/td-hm_clustr-t_embedded-coco-wholebody.py')
    with pytest.raises(ValueError, match=r'--amp on the CPU \(bfloat16 '
                       r'autocast\) cannot train an mmpose config'):
        use_amp(cfg)
    other = load_config('configs/clustr/clustr-t_embedded-imagenet.py')
    assert use_amp(other) == 'CPUAmpOptimWrapper'

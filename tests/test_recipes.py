"""Every config that reproduces a release trains with the official recipe:
configs/official_recipes.yml states each official recipe field by field (its
rows cite the official files) and names the configs that follow it; these
tests resolve each config with mmengine and hold it to its row."""
import importlib
from pathlib import Path

import pytest
import torch
import yaml
from conftest import MODEL_CONFIGS, TRAINING_DATA, load_config
from mmengine.optim import OptimWrapper, build_optim_wrapper
from mmengine.registry import PARAM_SCHEDULERS, DefaultScope
from test_configs import ROOT, build_model, release_file

TABLE = yaml.safe_load((ROOT / 'configs/official_recipes.yml').read_text())
ROWS = {path: dict(TABLE['recipes'][row['recipe']], **row)
        for path, row in TABLE['configs'].items()}


def _reproduces_a_release(path):
    cfg = load_config(path)
    if release_file(cfg) is not None:
        return True
    # ClusTR released no weights: its ImageNet classifiers of the paper's
    # models (not the ablations' variants) are what its recipe trains
    backbone = cfg.model.backbone
    return (TRAINING_DATA[path] == 'ImageNet-1k' and backbone.type == 'ClusTR'
            and set(backbone) <= {'type', 'arch', 'clustering_mode',
                                  'drop_path_rate'})


def test_every_release_config_has_a_row():
    paths = [str(p.relative_to(ROOT)) for p in MODEL_CONFIGS]
    wanted = {p for p in paths if _reproduces_a_release(p)}
    assert len(wanted) >= 42
    assert set(ROWS) == wanted, (
        f'no recipe row: {sorted(wanted - set(ROWS))}; '
        f'row for a config that reproduces no release: '
        f'{sorted(set(ROWS) - wanted)}')
    for name, recipe in TABLE['recipes'].items():
        assert recipe['source'], name  # each recipe cites where it came from


def _transform(pipeline, kind):
    """The one transform of a type in a pipeline (through RandomChoice)."""
    found = []
    for t in pipeline:
        if t['type'] == kind:
            found.append(t)
        for branch in t.get('transforms', []):
            found += [s for s in branch if s['type'] == kind]
    assert found, f'no {kind} in the training pipeline'
    return found[0]


_CURVES = {}


def _lr_curve(schedulers, base_lr, epochs, iterations, per_epoch, wanted):
    """The learning rate at each wanted (epoch, iteration within it) under
    the given schedulers, stepped as MMEngine's ParamSchedulerHook steps
    them (iteration-based ones after every iteration, epoch-based ones after
    every epoch). An iteration-based scheduler past its end changes nothing,
    so iterations after every such end and after the epoch's last wanted
    point are not simulated. Cached: many configs share one schedule."""
    key = repr((schedulers, base_lr, epochs, iterations, per_epoch,
                sorted(wanted)))
    if key in _CURVES:
        return _CURVES[key]
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.AdamW([param], lr=base_lr)
    wrapper = OptimWrapper(optimizer)
    built = []
    for s in schedulers:
        by_epoch = s.get('by_epoch', True)
        s = dict(s, optimizer=wrapper)
        s.setdefault('end', epochs if by_epoch else iterations)
        built.append((by_epoch, PARAM_SCHEDULERS.build(s)))
    optimizer.step()
    iter_end = max([s.end for by_epoch, s in built if not by_epoch],
                   default=0)
    lrs = {}
    for epoch in range(max(e for e, _ in wanted) + 1):
        last = max([i for e, i in wanted if e == epoch]
                   + [min(per_epoch, iter_end - epoch * per_epoch) - 1])
        for i in range(last + 1):
            if (epoch, i) in wanted:
                lrs[epoch, i] = optimizer.param_groups[0]['lr']
            if epoch * per_epoch + i < iter_end:
                for by_epoch, s in built:
                    if not by_epoch:
                        s.step()
        for by_epoch, s in built:
            if by_epoch:
                s.step()
    _CURVES[key] = lrs
    return lrs


def _points(row):
    """(epoch, iteration within it) -> official lr."""
    points = row['lr_points']
    if isinstance(points, dict):  # ImageNet: epochs
        return {(int(e), 0): lr for e, lr in points.items()}
    if 'iterations' in row:  # mmseg: one long "epoch"
        return {(0, int(i)): lr for i, lr in points}
    return {(int(e), int(i)): lr for e, i, lr in points}


@pytest.mark.parametrize('path', sorted(ROWS))
def test_config_follows_the_official_recipe(path):
    row, cfg = ROWS[path], load_config(path)
    wrapper = cfg.optim_wrapper
    optimizer = {k: v for k, v in wrapper.optimizer.items()
                 if k != '_scope_'}
    for key, value in row['optimizer'].items():
        got = optimizer.get(key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key
    # precision is the command's --amp (docs/weights.md), not fixed here
    assert wrapper.get('type', 'OptimWrapper') == 'OptimWrapper'
    assert wrapper.get('clip_grad') == (
        dict(max_norm=row['clip_grad']) if 'clip_grad' in row else None)
    if row.get('no_decay') == 'one-dimensional':
        paramwise = wrapper.paramwise_cfg
        assert paramwise.flat_decay_mult == paramwise.bias_decay_mult == 0.0
    assert cfg.model.backbone.drop_path_rate == row['drop_path']

    loader = cfg.train_dataloader
    assert loader.batch_size == row['batch_per_gpu']
    if 'auto_scale_lr' in cfg:  # --auto-scale-lr starts from the total
        assert cfg.auto_scale_lr.base_batch_size == (
            row['gpus'] * row['batch_per_gpu'])
    assert loader.sampler.type == row['sampler']
    assert loader.get('batch_sampler', {}).get('type') == row.get(
        'batch_sampler')
    if 'epochs' in row:
        assert cfg.train_cfg.max_epochs == row['epochs']
    else:
        assert cfg.train_cfg.max_iters == row['iterations']

    pipeline, aug = loader.dataset.pipeline, row['augmentation']
    if row['recipe'].endswith('imagenet'):
        crop = _transform(pipeline, 'RandomResizedCrop')
        assert (crop['scale'], crop['interpolation']) == (
            row['crop'], row['interpolation'])
        rand = _transform(pipeline, 'RandAugment')
        assert (rand['magnitude_level'], rand['magnitude_std'],
                rand['num_policies'], rand['policies']) == (
            aug['rand_augment_magnitude'], aug['rand_augment_std'],
            aug['rand_augment_ops'], 'timm_increasing')
        assert _transform(pipeline, 'RandomErasing')['erase_prob'] == \
            aug['random_erasing']
        # Mixup / CutMix: one of the two per batch (timm's switch 0.5)
        assert cfg.model.train_cfg.augments == [
            dict(type='Mixup', alpha=aug['mixup']),
            dict(type='CutMix', alpha=aug['cutmix'])]
        assert cfg.model.head.loss.label_smooth_val == aug['label_smoothing']
    elif 'train_scales' in row and 'short' in row['train_scales']:
        low, high, step = row['train_scales']['short']
        scales = [(row['train_scales']['long'], s)
                  for s in range(low, high + 1, step)]
        assert _transform(pipeline, 'RandomChoiceResize')['scales'] == scales
        assert tuple(_transform(pipeline, 'RandomCrop')['crop_size']) == \
            tuple(aug['detr_crop'])
    else:
        resize = _transform(pipeline, 'RandomResize')
        assert (list(resize['scale']), list(resize['ratio_range'])) == (
            row['train_scales']['scale'], row['train_scales']['ratio_range'])
        crop = _transform(pipeline, 'RandomCrop')
        assert (list(crop['crop_size']), crop['cat_max_ratio']) == (
            row['crop'], aug['cat_max_ratio'])
        assert _transform(pipeline, 'PhotoMetricDistortion')
    assert _transform(pipeline, 'RandomFlip')['prob'] == aug['flip']

    points = _points(row)
    per_epoch = row.get('iterations', row.get('iterations_per_epoch', 1))
    curve = _lr_curve(
        [dict(s) for s in cfg.param_scheduler],
        optimizer['lr'], row.get('epochs', 1), row.get('iterations', 0),
        per_epoch, frozenset(points))
    for point, lr in points.items():
        assert curve[point] == pytest.approx(lr, rel=1e-9), point


def _official_name(name, param, backbone):
    """The official code's name of one of our parameters (PaCa-ViT's
    backbone through the converter's inverse map; necks and heads are named
    alike in both)."""
    from test_paca import to_official
    if not name.startswith('backbone.') or backbone.type != 'PaCaViT':
        return name
    (official, *_) = to_official({name[len('backbone.'):]: param},
                                 backbone.get('clustering', 'conv'))
    return 'backbone.' + official


def _official_group(name, param, row):
    """(lr, weight decay) the official recipe gives a parameter: timm's
    ImageNet rule (no decay on one-dimensional parameters and biases), or
    MMEngine's custom_keys (the longest key found in the name wins)."""
    lr, wd = row['optimizer']['lr'], row['optimizer']['weight_decay']
    if row.get('no_decay') == 'one-dimensional':
        flat = param.ndim <= 1 or name.endswith('.bias')
        return lr, 0.0 if flat else wd
    keys = row['custom_keys']
    for key in sorted(sorted(keys), key=len, reverse=True):
        if key in name:
            return (lr * keys[key].get('lr_mult', 1.0),
                    wd * keys[key].get('decay_mult', 1.0))
    return lr, wd


@pytest.mark.slow  # builds 44 models: 31 s on one core
@pytest.mark.parametrize('path', sorted(ROWS))
def test_parameter_groups_are_the_official(path):
    """Built as the runner builds it, every parameter's learning rate and
    weight decay are the ones the official recipe gives the same parameter
    under its official name (e.g. the PaCa head's x10 on the last clustering
    conv reaches no parameter of the mlp or teacher models there, so none
    here)."""
    row, cfg = ROWS[path], load_config(path)
    model = build_model(cfg)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    groups = {id(p): group for group in wrapper.optimizer.param_groups
              for p in group['params']}
    for name, param in model.named_parameters():
        official = _official_name(name, param, cfg.model.backbone)
        got = groups[id(param)]
        assert (got['lr'], got['weight_decay']) == pytest.approx(
            _official_group(official, param, row)), (name, official)

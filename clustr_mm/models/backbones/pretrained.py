"""Filling a backbone with pretrained weights, tolerant of a changed cluster
count.

Fine-tuning PaCa-ViT for segmentation uses 200 clusters per stage where the
ImageNet checkpoint has 100, so the layers that emit cluster logits change
shape. Those layers are re-initialised and named in a warning; everything else
must load, and a checkpoint that fills nothing is an error (the official code
silently trained from scratch on a wrong path or prefix).

Files are read through MMEngine's ``CheckpointLoader``; importing clustr_mm
makes that loader safe (no code runs on load), cache URLs by their whole
address and convert official PaCa-ViT files (``clustr_mm.checkpoints``).
"""
import warnings
from typing import Callable, Dict, Mapping, Optional

import torch
from mmengine.logging import print_log
from mmengine.runner.checkpoint import CheckpointLoader
from torch import nn

from ...protocols import state_dict_upgrade
from ...registry import skip_note

StateDict = Dict[str, torch.Tensor]
OFFICIAL_HINT = (
    'official PaCa-ViT files are recognised (and converted) by their keys '
    'patch_embed.proj.0.weight and stage1.0.attn.q.weight, at the top level '
    '(timm classifier) or under backbone. (mmdet / mmseg)')


def _examples(keys, n: int = 3) -> str:
    """`` (a, b, c, ... N more)``: a few names of a long list."""
    more = f', ... {len(keys) - n} more' if len(keys) > n else ''
    return ' (' + ', '.join(keys[:n]) + more + ')'


def state_dict_key(checkpoint: Mapping) -> Optional[str]:
    """``'state_dict'`` or ``'model'``, whichever wraps the weights (the
    former if both do: MMEngine's convention), or None for a bare state
    dict. The one place that decides it; ``checkpoints`` reads it too."""
    for key in ('state_dict', 'model'):
        if key in checkpoint and isinstance(checkpoint[key], Mapping):
            return key
    return None


def unwrap_state_dict(checkpoint: Mapping) -> Mapping[str, torch.Tensor]:
    """The state dict inside ``{'state_dict': ...}`` / ``{'model': ...}``
    (see :func:`state_dict_key`)."""
    key = state_dict_key(checkpoint)
    return checkpoint if key is None else checkpoint[key]


def strip_module_prefix(state: Mapping[str, torch.Tensor]
                        ) -> Mapping[str, torch.Tensor]:
    """Drop the ``module.`` prefix of a DataParallel / DDP state dict."""
    if state and all(k.startswith('module.') for k in state):
        return {k[len('module.'):]: v for k, v in state.items()}
    return state


def _default_reinit(module: nn.Module) -> None:
    module.reset_parameters()


def load_backbone_state(model: nn.Module,
                        state_dict: Mapping[str, torch.Tensor],
                        prefix: Optional[str] = None,
                        reinit: Optional[Callable[[nn.Module], None]] = None
                        ) -> Dict[str, list]:
    """Load ``state_dict`` into ``model``, re-initialising shape mismatches.

    Args:
        model: The module to fill.
        state_dict: Weights (keys of ``model``, or under ``prefix``).
        prefix: Only keys starting with it are used, with it removed (e.g.
            ``'backbone.'`` for a whole detector / classifier checkpoint).
        reinit: Called on every module owning a shape-mismatched tensor
            (e.g. a clustering layer with a different number of clusters);
            defaults to the module's ``reset_parameters()``.

    Returns:
        dict with the ``loaded``, ``reinitialized``, ``missing`` and
        ``unexpected`` key lists. Everything but ``loaded`` is also reported
        in one ``UserWarning``.

    Raises:
        RuntimeError: if no key of the checkpoint fits the model.
    """
    own = model.state_dict()
    if prefix:
        selected = {k[len(prefix):]: v for k, v in state_dict.items()
                    if k.startswith(prefix)}
        if not selected:
            raise RuntimeError(
                f'no checkpoint key starts with prefix {prefix!r}; first '
                f'keys: {list(state_dict)[:5]}; {type(model).__name__} '
                f'expects keys like {list(own)[:3]} under it')
        state_dict = selected
    upgrade = state_dict_upgrade(model)
    if upgrade is not None:
        state_dict = upgrade(state_dict)
    loadable, mismatched = {}, {}
    for key, value in state_dict.items():
        if key not in own:
            continue
        if own[key].shape == value.shape:
            loadable[key] = value
        else:
            mismatched[key] = (tuple(value.shape), tuple(own[key].shape))
    if not loadable:
        raise RuntimeError(
            f'none of the {len(state_dict)} checkpoint keys match '
            f'{type(model).__name__} (wrong checkpoint or prefix?); '
            f'checkpoint keys start {list(state_dict)[:5]}, expected keys '
            f'like {list(own)[:5]} (with prefix, e.g. prefix=\'backbone.\': '
            f'backbone.{next(iter(own), "")}); {OFFICIAL_HINT}.'
            + skip_note('checkpoint_loaders'))

    reinit = reinit or _default_reinit
    owners = sorted({key.rsplit('.', 1)[0] for key in mismatched})
    for name in owners:
        reinit(model.get_submodule(name))
    model.load_state_dict(loadable, strict=False)

    report = dict(
        loaded=sorted(loadable),
        reinitialized=owners,
        missing=sorted(set(own) - set(loadable) - set(mismatched)),
        unexpected=sorted(set(state_dict) - set(own)))
    lines = []
    if mismatched:
        lines.append('re-initialised (shape differs from the checkpoint): ' +
                     ', '.join(f'{k} {ckpt}->{ours}'
                               for k, (ckpt, ours) in mismatched.items()))
    if report['missing']:
        lines.append(f"{len(report['missing'])} model tensors missing in "
                     f"the checkpoint{_examples(report['missing'])}")
    if report['unexpected']:
        lines.append(f"{len(report['unexpected'])} of the "
                     f'{len(state_dict)} checkpoint tensors unused by the '
                     f"model{_examples(report['unexpected'])}")
    if lines:
        warnings.warn(
            f'{type(model).__name__}: loaded {len(loadable)} of {len(own)} '
            'tensors; ' + '; '.join(lines), UserWarning, stacklevel=2)
    return report


def _checked_init_cfgs(backbone) -> list:
    cfgs = backbone.init_cfg or []
    cfgs = [cfgs] if isinstance(cfgs, dict) else list(cfgs)
    name = type(backbone).__name__
    for cfg in cfgs:
        if not isinstance(cfg, dict) or 'type' not in cfg:
            hint = ''
            if isinstance(cfg, dict) and 'checkpoint' in cfg:
                hint = (
                    " (e.g. --cfg-options model.backbone.init_cfg.checkpoint="
                    "... on a config whose init_cfg is None; also pass "
                    "model.backbone.init_cfg.type=Pretrained)")
            raise ValueError(
                f'{name} init_cfg entry {cfg!r} has no type; expected e.g. '
                "dict(type='Pretrained', checkpoint=PATH_OR_URL)" + hint)
        if cfg['type'] == 'Pretrained' and not cfg.get('checkpoint'):
            raise ValueError(
                f"{name} init_cfg {cfg!r}: type='Pretrained' needs "
                'checkpoint=PATH_OR_URL (a weights file or an http(s) URL)')
    return cfgs


def _read_state(filename: str, map_location) -> StateDict:
    checkpoint = CheckpointLoader.load_checkpoint(filename, map_location)
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f'{filename} holds a {type(checkpoint).__name__}, '
                        'expected a state dict')
    return strip_module_prefix(unwrap_state_dict(checkpoint))


def init_backbone_weights(backbone, official_init: Callable[[nn.Module], None]
                          ) -> None:
    """Official from-scratch init, other ``init_cfg`` entries, then weights.

    Replaces MMEngine's ``Pretrained`` handling for our backbones: a
    ``Pretrained`` entry is applied last through :func:`load_backbone_state`,
    so loaded weights are never overwritten, shape-mismatched layers are
    re-initialised with ``official_init`` and named in a warning, and a path
    or prefix that fills nothing is an error instead of a silent
    from-scratch run. Without ``prefix``, a whole-model checkpoint (every key
    matching only under ``backbone.``, e.g. a converted official file) gives
    its ``backbone.*`` keys.
    """
    from mmengine.model import initialize
    from mmengine.model.weight_init import update_init_info
    if backbone.is_init:
        return
    cfgs = _checked_init_cfgs(backbone)
    backbone.apply(official_init)
    others = [c for c in cfgs if c['type'] != 'Pretrained']
    if others:
        initialize(backbone, others)
    for cfg in cfgs:
        if cfg['type'] != 'Pretrained':
            continue
        state = _read_state(cfg['checkpoint'], cfg.get('map_location', 'cpu'))
        prefix = cfg.get('prefix')
        if prefix and not prefix.endswith('.'):
            prefix += '.'  # MMEngine's Pretrained takes 'backbone' too
        own = backbone.state_dict()
        if (not prefix and not any(k in own for k in state)
                and any(k.startswith('backbone.') for k in state)):
            prefix = 'backbone.'
            print_log(f'{type(backbone).__name__}: {cfg["checkpoint"]} is a '
                      'whole-model checkpoint; loading its backbone.* keys',
                      logger='current')
        load_backbone_state(backbone, state, prefix=prefix,
                            reinit=lambda m: m.apply(official_init))
    if hasattr(backbone, '_params_init_info'):  # set by a parent model
        update_init_info(backbone, f'{type(backbone).__name__} official init '
                         f'+ init_cfg {cfgs}')
    backbone._is_init = True

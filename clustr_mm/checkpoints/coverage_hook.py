"""Refuse a runner checkpoint that does not fit the model, either way.

MMEngine loads ``load_from`` (and ``tools/test.py``'s checkpoint) with
``strict=False`` and only logs the keys that did not match, so the weights of
another model evaluate random weights and exit 0. The hook checks, before the
weights are copied, that every tensor of the model (parameters and buffers,
BatchNorm's ``num_batches_tracked`` aside) gets one of the same shape and
that every tensor of the checkpoint is used (the weights of a deeper model
of the same family fill every tensor of a shallower one), and otherwise
stops with the counts, a few names each way and how to allow it. The same
check holds a ``Pretrained`` ``init_cfg`` of any module but our backbones
(the model's own, a neck's, a head's: MMEngine loads those with
``strict=False`` too); our backbones check their own ``Pretrained`` entry
(:func:`~clustr_mm.models.backbones.pretrained.init_backbone_weights`), so
fine-tuning from an ImageNet backbone is unaffected.
"""
import re
from typing import Dict, List, Mapping

import torch

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from torch import nn

from ..registry import skip_note, switch_value
from .paca_official import SIGNATURE, paca_official_layout

OPTION = 'allow_partial_load'


def partial_load_allowed(cfg) -> bool:
    """The config's :data:`OPTION`, parsed strictly
    (:func:`~clustr_mm.registry.switch_value`): ``--cfg-options
    allow_partial_load=no`` leaves the string ``'no'``, which used to read
    as yes."""
    return switch_value(OPTION, cfg.get(OPTION, None), False)


class PartialLoadError(RuntimeError):
    """A checkpoint leaves model tensors without weights, or holds tensors
    the model does not use."""


def load_coverage(model: nn.Module, checkpoint: Mapping) -> Dict[str, List]:
    """What loading ``checkpoint`` as MMEngine does would leave out.

    Returns ``loaded``, ``missing`` and ``mismatched`` (model keys) and
    ``unexpected`` (checkpoint keys), ``unloaded_elements`` /
    ``total_elements`` (tensor sizes summed) and ``official_layout`` (an
    official PaCa-ViT file's layout, None for others).
    """
    state = checkpoint.get('state_dict', checkpoint)
    state = {re.sub(r'^module\.', '', k): v for k, v in state.items()}
    own = {k: v for k, v in model.state_dict().items()
           if not k.endswith('num_batches_tracked')}
    report = dict(loaded=[], missing=[], mismatched=[], unexpected=[])
    unloaded = 0
    for key, value in own.items():
        if key not in state:
            report['missing'].append(key)
            unloaded += value.numel()
        elif tuple(state[key].shape) != tuple(value.shape):
            report['mismatched'].append(
                f'{key} {tuple(state[key].shape)}->{tuple(value.shape)}')
            unloaded += value.numel()
        else:
            report['loaded'].append(key)
    report['unexpected'] = [k for k in state if k not in own and
                            not k.endswith('num_batches_tracked')]
    report['unloaded_elements'] = unloaded
    report['official_layout'] = paca_official_layout(state)
    # top-level keys that wrap weights MMEngine does not look into
    report['wrappers'] = [k for k, v in state.items() if isinstance(
        v, Mapping) and any(isinstance(t, torch.Tensor) for t in v.values())]
    report['total_elements'] = sum(v.numel() for v in own.values())
    return report


def _examples(keys: List[str], n: int = 3) -> str:
    """`` (a, b, c, ... N more)`` or nothing for an empty list."""
    if not keys:
        return ''
    more = f', ... {len(keys) - n} more' if len(keys) > n else ''
    return ' (' + ', '.join(keys[:n]) + more + ')'


def describe_coverage(report: Dict[str, List], model: nn.Module,
                      source: str) -> str:
    """One paragraph with the counts of :func:`load_coverage`, both ways:
    model tensors the checkpoint leaves unloaded, checkpoint tensors the
    model does not use."""
    missing, mismatched = report['missing'], report['mismatched']
    loaded, unexpected = report['loaded'], report['unexpected']
    total = len(loaded) + len(missing) + len(mismatched)
    share = report['unloaded_elements'] / max(report['total_elements'], 1)
    in_file = len(loaded) + len(mismatched) + len(unexpected)
    text = (f'{source} leaves {total - len(loaded)} of {total} tensors of '
            f'{type(model).__name__} ({share:.1%} of its weights) unloaded: '
            f'{len(missing)} missing from the checkpoint{_examples(missing)}, '
            f'{len(mismatched)} with another shape{_examples(mismatched)}; '
            f'{len(loaded)} loaded; and {len(unexpected)} of its '
            f'{in_file} checkpoint tensors are unused by the model'
            f'{_examples(unexpected)}.')
    if unexpected and not missing and not mismatched:
        text += (' Every model tensor has weights, but the checkpoint holds '
                 'more: the weights of a larger model (e.g. a deeper variant '
                 'of the same family)?')
    if report.get('official_layout') is not None:
        text += (' The checkpoint is an official PaCa-ViT file that was not '
                 'converted.' + skip_note('checkpoint_loaders'))
    elif not loaded and report.get('wrappers'):
        text += (' Its tensors sit under the top-level key(s) '
                 f'{report["wrappers"]}, which MMEngine does not look into '
                 "(it reads 'state_dict' or the top level): save the weights "
                 "as {'state_dict': weights}.")
    elif not loaded:
        text += (' None of its keys fit this model (another model?); '
                 f'expected keys like{_examples(missing)}, or an official '
                 'PaCa-ViT file (converted on load), recognised by '
                 f'{" and ".join(SIGNATURE)} at the top level (timm) or '
                 'under backbone. (mmdet / mmseg).')
    return text


def _pretrained_entries(module: nn.Module) -> List[Mapping]:
    """The ``Pretrained`` entries of a module's ``init_cfg``."""
    cfg = getattr(module, 'init_cfg', None)
    entries = cfg if isinstance(cfg, (list, tuple)) else [cfg]
    return [e for e in entries if isinstance(e, Mapping)
            and e.get('type') == 'Pretrained']


def pretrained_state(entry: Mapping) -> Mapping:
    """The weights a ``Pretrained`` entry gives its module, read as MMEngine's
    ``PretrainedInit`` reads them (with a prefix: the keys under it)."""
    from mmengine.runner.checkpoint import (_load_checkpoint,
                                            _load_checkpoint_with_prefix)
    prefix = entry.get('prefix')
    if prefix:
        return _load_checkpoint_with_prefix(prefix, entry['checkpoint'],
                                            map_location='cpu')
    return _load_checkpoint(entry['checkpoint'], map_location='cpu')


@HOOKS.register_module(force=True)
class CheckpointCoverageHook(Hook):
    """Stop when ``load_from`` / ``tools/test.py``'s checkpoint / a resumed
    checkpoint leaves model tensors without weights (missing or of another
    shape) or holds tensors the model does not use, unless the config sets ``allow_partial_load = True``
    (``--allow-partial-load`` of tools/train.py and tools/test.py); then the
    counts are logged as a warning. Added by tools/train.py and
    tools/test.py."""

    priority = 'VERY_HIGH'

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        source = runner.cfg.get('load_from') or 'the checkpoint'
        _refuse_partial(runner, model, load_coverage(model, checkpoint),
                        f'checkpoint {source}', 'Loading it anyway')

    def before_train(self, runner) -> None:
        """A ``Pretrained`` init of a module other than our backbones, when
        no ``load_from`` / resumed checkpoint replaced the initial weights
        (after the runner's ``init_weights``, before iteration 1)."""
        from ..models.backbones.base import PyramidBackbone
        if runner.cfg.get('load_from') or getattr(runner, '_has_loaded',
                                                   False):
            return
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        for name, module in model.named_modules():
            if isinstance(module, PyramidBackbone):
                continue
            for entry in _pretrained_entries(module):
                where = f'model.{name}' if name else 'model'
                _refuse_partial(
                    runner, module,
                    load_coverage(module, pretrained_state(entry)),
                    f'{where}.init_cfg Pretrained {entry["checkpoint"]}',
                    'Training from it anyway',
                    hint='To fine-tune one part of the model, give that '
                    "part the entry (e.g. model.backbone.init_cfg with "
                    "prefix='backbone.'). ")


def _refuse_partial(runner, module: nn.Module, report: Dict[str, List],
                    source: str, anyway: str, hint: str = '') -> None:
    """Raise :class:`PartialLoadError` for a load that leaves tensors of
    ``module`` out or checkpoint tensors unused (``report``:
    :func:`load_coverage`); with ``allow_partial_load``, a warning."""
    if not (report['missing'] or report['mismatched']
            or report['unexpected']):
        return
    text = describe_coverage(report, module, source)
    if partial_load_allowed(runner.cfg):
        runner.logger.warning(f'{text} {anyway} ({OPTION}).')
        return
    raise PartialLoadError(f'{text} {hint}{_REFUSAL}')


_REFUSAL = (
    'Unloaded tensors would run with random weights; unused checkpoint '
    'tensors mean the file is of another model. If that is intended (e.g. '
    'fine-tuning a detector with other classes), pass --allow-partial-load '
    f'to tools/train.py / tools/test.py or set {OPTION} = True in the config.')


def add_coverage_check(cfg, allow_partial_load: bool = False) -> None:
    """Add the hook to ``cfg.custom_hooks`` (once); ``allow_partial_load``
    (a tool's ``--allow-partial-load``) sets the config's option."""
    if cfg.get(OPTION, None) is not None:  # 'no' -> False; 'maybe' refused
        cfg[OPTION] = partial_load_allowed(cfg)
    hooks = cfg.get('custom_hooks') or []
    if not any(h.get('type') == CheckpointCoverageHook.__name__
               for h in hooks):
        cfg.custom_hooks = [*hooks, dict(type=CheckpointCoverageHook.__name__)]
    if allow_partial_load:
        cfg[OPTION] = True

"""Settings with which a training run goes nowhere, refused before iteration 1.

MMEngine accepts them and then trains nothing (``max_epochs=0``, a resumed
checkpoint that already reached ``max_epochs``), trains on gradients it has
multiplied by 0 (``optim_wrapper.clip_grad.max_norm=0``) or crashes after a
whole epoch (``train_cfg.val_interval=0``: ``ZeroDivisionError`` in its
loop). Two doors check them:

- :func:`check_run_settings` reads the config: ``tools/train.py`` calls it
  before it builds anything;
- :func:`check_runner` reads the built runner (its loop, optimizer wrapper,
  schedulers and the resumed position): ``FailFastHook.before_train`` calls
  it, so every runner with that hook gets the checks (every shipped config
  lists it, ``tools/train.py`` adds it to a config that lacks it; the
  analysis tools' short runs and the libraries' own tools and ``mim`` run
  the configs' hooks).

Each error names the setting, its value and what to do instead.
"""
import copy
import difflib
import inspect
import math
import warnings
from types import SimpleNamespace
from typing import Iterator, Optional, Tuple

import torch


class RunSettingError(ValueError):
    """A setting with which the run would train nothing, or fail later."""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --- the run's length --------------------------------------------------------
def check_train_length(cfg) -> None:
    """Refuse a training run that would train nothing: ``max_epochs`` /
    ``max_iters`` below 1 (MMEngine runs zero iterations, writes no
    checkpoint and exits 0 without a word)."""
    train_cfg = cfg.get('train_cfg') or {}
    for key in ('max_epochs', 'max_iters'):
        value = train_cfg.get(key)
        if value is None:
            continue
        if not _is_int(value) or value < 1:
            raise RunSettingError(
                f'train_cfg.{key}={value!r}: nothing would be trained (no '
                f'iteration, no checkpoint); {key} must be an int >= 1. To '
                'evaluate a checkpoint use tools/test.py')


# --- validation interval -----------------------------------------------------
def check_interval(value, name: str) -> None:
    """``train_cfg.val_interval`` (or a ``dynamic_intervals`` entry):
    MMEngine's loops take ``epoch % val_interval``: 0 fails with
    ``ZeroDivisionError`` after the first epoch (or iteration), a negative or
    fractional one validates at other times than asked."""
    if not _is_int(value) or value < 1:
        raise RunSettingError(
            f'{name}={value!r}: the run would fail at its first validation '
            "(MMEngine's loop takes the epoch or iteration modulo this "
            f'interval); {name} must be an int >= 1 (validate every N epochs, '
            'or iterations for an iteration-based loop). To train without '
            'validation set val_cfg=None val_dataloader=None '
            'val_evaluator=None')


def _check_dynamic_intervals(intervals, where: str) -> None:
    for i, entry in enumerate(intervals or []):
        if isinstance(entry, (list, tuple)) and len(entry) == 2:
            check_interval(entry[1], f'{where}[{i}][1]')


# --- gradient clipping -------------------------------------------------------
_CLIP_FUNCS = {'norm': torch.nn.utils.clip_grad_norm_,
               'value': torch.nn.utils.clip_grad_value_}
_CLIP_KEY = {'norm': 'max_norm', 'value': 'clip_value'}


def check_clip_grad(clip, name: str = 'optim_wrapper.clip_grad') -> None:
    """``clip_grad`` as MMEngine's ``OptimWrapper`` passes it to
    ``clip_grad_norm_`` (``type='norm'``, the default) or
    ``clip_grad_value_`` (``type='value'``): a limit of 0 multiplies every
    gradient by 0 (only weight decay moves the weights, while the log shows
    the gradient norm before clipping), a negative one turns the gradients
    round (gradient ascent), NaN makes them NaN; a missing or misspelt
    argument fails at the first step."""
    if clip is None:
        return
    if not isinstance(clip, dict):
        raise RunSettingError(
            f'{name}={clip!r}: must be a dict such as dict(max_norm=1.0) or '
            "dict(type='value', clip_value=1.0), or None for no clipping")
    kind = clip.get('type', 'norm')
    if kind not in _CLIP_FUNCS:
        raise RunSettingError(
            f"{name}.type={kind!r}: MMEngine clips by 'norm' "
            "(clip_grad_norm_, the default) or 'value' (clip_grad_value_)")
    key = _CLIP_KEY[kind]
    valid = [p for p in inspect.signature(_CLIP_FUNCS[kind]).parameters
             if p != 'parameters']
    for option in clip:
        if option != 'type' and option not in valid:
            near = difflib.get_close_matches(option, valid, n=1)
            hint = f' (did you mean {near[0]!r}?)' if near else ''
            raise RunSettingError(
                f'{name}: unknown option {option!r}{hint}; clipping by '
                f'{kind} takes {", ".join(valid)} (torch.nn.utils.'
                f'{_CLIP_FUNCS[kind].__name__}); the run would fail at its '
                'first step')
    if key not in clip:
        raise RunSettingError(
            f'{name}={dict(clip)!r} has no {key}: clipping by {kind} needs '
            f'{name}.{key}=N (> 0); the run would fail at its first step')
    limit = clip[key]
    if not _is_number(limit) or math.isnan(limit) or limit <= 0:
        if not _is_number(limit):
            effect = 'is not a number'
        elif math.isnan(limit):
            effect = 'makes every gradient NaN'
        elif limit == 0:
            logged = (' (the logged grad_norm is the norm before clipping)'
                      if kind == 'norm' else '')
            effect = ('multiplies every gradient by 0: only weight decay '
                      f'would move the weights{logged}')
        else:
            effect = ('turns every gradient round: the run would climb the '
                      'loss' if kind == 'norm' else 'sets every gradient to '
                      f'the same value {limit!r}: the run would not follow '
                      'the loss')
        raise RunSettingError(
            f'{name}.{key}={limit!r} {effect}. It must be a number > 0 (the '
            f'largest gradient {kind} to keep, e.g. 1.0 or 35); for no '
            f'clipping set {name}=None')


# --- optimizer wrapper -------------------------------------------------------
def _wrappers(optim_wrapper) -> Iterator[Tuple[str, dict]]:
    """('optim_wrapper', cfg) and, for a wrapper dict of several optimizers
    (``constructor='MultiOptimWrapperConstructor'``), each named one."""
    if not isinstance(optim_wrapper, dict):
        return
    yield 'optim_wrapper', optim_wrapper
    for key, value in optim_wrapper.items():
        if isinstance(value, dict) and 'optimizer' in value:
            yield f'optim_wrapper.{key}', value


def check_lr(lr, name: str) -> None:
    """A learning rate that is not a finite number >= 0 (torch takes inf:
    the first step makes the weights inf or NaN)."""
    if _is_number(lr) and not (math.isfinite(lr) and lr >= 0):
        effect = ('a negative rate climbs the loss' if lr < 0 and
                  math.isfinite(lr) else
                  'the first step would make the weights inf or NaN')
        raise RunSettingError(
            f'{name}={lr!r}: {effect}; the learning rate must be a finite '
            'number >= 0')


def _check_loss_scale(scale, name: str) -> None:
    """AMP's static loss scale (or the dynamic scaler's ``init_scale``): 0
    zeroes every gradient and the scaler then skips every step as
    non-finite."""
    if isinstance(scale, dict):
        scale, name = scale.get('init_scale'), f'{name}.init_scale'
    if _is_number(scale) and not (math.isfinite(scale) and scale > 0):
        raise RunSettingError(
            f'{name}={scale!r}: the loss is multiplied by it before the '
            'backward pass, so every gradient would be 0 or non-finite and '
            "every step skipped; use a number > 0 (e.g. 512.) or 'dynamic'")


# --- learning-rate schedulers ------------------------------------------------
def _scheduler_class(type_or_cls):
    from mmengine.registry import PARAM_SCHEDULERS
    if isinstance(type_or_cls, str):
        try:
            return PARAM_SCHEDULERS.get(type_or_cls)
        except Exception:  # an unknown type: MMEngine names it when building
            return None
    return type_or_cls


def check_scheduler_factors(type_or_cls, settings: dict, name: str) -> None:
    """MMEngine's linear schedulers (``LinearLR``, ...) divide by their
    running factor, its constant ones (``ConstantLR``, ...) by their factor
    when they end: ``start_factor=0`` fails with ``ZeroDivisionError`` at the
    first step (after iteration 1), ``factor=0`` at the scheduler's end
    (near the end of the run, which trained at lr 0 until then)."""
    from mmengine.optim.scheduler.param_scheduler import (
        ConstantParamScheduler, LinearParamScheduler)
    cls = _scheduler_class(type_or_cls)
    if not isinstance(cls, type):
        return
    for base, key, when, fix in (
            (LinearParamScheduler, 'start_factor', 'after iteration 1',
             'warm up from a small factor instead (e.g. start_factor=1e-3)'),
            (ConstantParamScheduler, 'factor', 'at its end, after training '
             'at a learning rate of 0 until then', 'use a factor > 0 (e.g. '
             '1e-3), or end the run where it should stop')):
        if issubclass(cls, base) and settings.get(key) == 0:
            raise RunSettingError(
                f"{name}.{key}=0: MMEngine's {cls.__name__} divides by this "
                'factor, so the run would fail with ZeroDivisionError '
                f'{when}; {fix}')


def _scheduler_cfgs(param_scheduler) -> Iterator[Tuple[str, dict]]:
    if isinstance(param_scheduler, dict) and 'type' not in param_scheduler:
        for key, value in param_scheduler.items():  # one list per optimizer
            for name, cfg in _scheduler_cfgs(value):
                yield name.replace('param_scheduler',
                                   f'param_scheduler.{key}', 1), cfg
        return
    items = (param_scheduler if isinstance(param_scheduler, (list, tuple))
             else [param_scheduler])
    for i, cfg in enumerate(items):
        if isinstance(cfg, dict):
            yield (f'param_scheduler[{i}]' if isinstance(
                param_scheduler, (list, tuple)) else 'param_scheduler'), cfg


# --- the config --------------------------------------------------------------
def check_run_settings(cfg) -> None:
    """Refuse the settings of ``cfg`` with which a training run would train
    nothing or fail after it started (see the module docstring); raises
    :class:`RunSettingError` naming the first one found."""
    check_train_length(cfg)
    train_cfg = cfg.get('train_cfg') or {}
    validates = (cfg.get('val_cfg') is not None
                 and cfg.get('val_dataloader') is not None)
    if validates:
        if 'val_interval' in train_cfg:
            check_interval(train_cfg['val_interval'], 'train_cfg.val_interval')
        _check_dynamic_intervals(train_cfg.get('dynamic_intervals'),
                                 'train_cfg.dynamic_intervals')
    for loader in ('train_dataloader',) + (('val_dataloader',)
                                           if validates else ()):
        size = (cfg.get(loader) or {}).get('batch_size')
        if size is not None and (not _is_int(size) or size < 1):
            raise RunSettingError(
                f'{loader}.batch_size={size!r}: must be an int >= 1 (the '
                'samples per process and step)')
    for where, wrapper in _wrappers(cfg.get('optim_wrapper')):
        check_clip_grad(wrapper.get('clip_grad'), f'{where}.clip_grad')
        optimizer = wrapper.get('optimizer')
        if isinstance(optimizer, dict):
            check_lr(optimizer.get('lr'), f'{where}.optimizer.lr')
        _check_loss_scale(wrapper.get('loss_scale'), f'{where}.loss_scale')
    for name, scheduler in _scheduler_cfgs(cfg.get('param_scheduler')):
        check_scheduler_factors(scheduler.get('type'), scheduler, name)
    auto = cfg.get('auto_scale_lr') or {}
    if auto.get('enable'):
        base = auto.get('base_batch_size')
        if not _is_int(base) or base < 1:
            raise RunSettingError(
                f'auto_scale_lr.base_batch_size={base!r}: --auto-scale-lr '
                'divides the batch size of the run by it; give the total '
                'batch size the learning rate was set for (an int >= 1, '
                'e.g. 8 GPUs x 32 = 256)')


# --- the built runner --------------------------------------------------------
def _checkpoint_name(runner) -> str:
    return str(getattr(runner, '_load_from', None)
               or runner.cfg.get('load_from') or 'the checkpoint')


def _count(n: int, what: str) -> str:
    return f'{n} {what}{"" if n == 1 else "s"}'


def _check_position(runner) -> None:
    """A run with no iteration: a loop of length 0, or a resumed checkpoint
    that already reached the end of the run (the loop would not run once,
    save nothing and say nothing)."""
    loop = runner.train_loop
    by_epoch = not _iter_based(loop)
    key = 'max_epochs' if by_epoch else 'max_iters'
    limit, done = ((runner.max_epochs, runner.epoch) if by_epoch
                   else (runner.max_iters, runner.iter))
    if by_epoch and limit >= 1 and len(runner.train_dataloader) == 0:
        loader = runner.train_dataloader
        raise RunSettingError(
            f'train_dataloader gives 0 batches per epoch: batch_size='
            f'{loader.batch_size} with drop_last={loader.drop_last} over '
            f'{len(loader.dataset)} samples; nothing would be trained. Lower '
            'train_dataloader.batch_size or set drop_last=False')
    if limit < 1:
        check_train_length({'train_cfg': {key: limit}})
    if done < limit:
        return
    iters = _count(runner.iter, 'iteration')
    saved = (f'{_count(runner.epoch, "epoch")} ({iters})' if by_epoch
             else iters)
    raise RunSettingError(
        f'resuming {_checkpoint_name(runner)}, saved after {saved}, with '
        f'train_cfg.{key}={limit}: nothing is left to train (no iteration '
        'would run, no checkpoint would be saved). To train further raise '
        f'train_cfg.{key} above {done} (--cfg-options train_cfg.{key}=N); '
        'to evaluate the checkpoint use tools/test.py; to start again from '
        'its weights use load_from=PATH without --resume')


def _iter_based(loop) -> bool:
    from mmengine.runner import IterBasedTrainLoop
    return isinstance(loop, IterBasedTrainLoop)


def _optim_wrappers(runner):
    wrapper = runner.optim_wrapper
    inner = getattr(wrapper, 'optim_wrappers', None)  # OptimWrapperDict
    if isinstance(inner, dict):
        return [(f'optim_wrapper.{k}', w) for k, w in inner.items()]
    return [('optim_wrapper', wrapper)]


def _zero_lr_run(runner) -> Optional[str]:
    """The schedulers' names when they keep every trainable parameter
    group's learning rate at 0 for every remaining iteration of the run
    (stepped on copies that drive a stand-in optimizer, as
    ``ParamSchedulerHook`` steps them; stops at the first rate > 0), else
    None. Schedulers stepped by validation metrics are not simulated."""
    schedulers = runner.param_schedulers
    if not isinstance(schedulers, list) or not schedulers or any(
            getattr(s, 'need_val_args', False) for s in schedulers):
        return None
    groups = getattr(runner.optim_wrapper, 'param_groups', None)
    if not groups or any(getattr(s, 'optimizer', None) is None
                         for s in schedulers):
        return None
    trainable = [i for i, g in enumerate(groups)
                 if any(p.requires_grad for p in g['params'])]
    stand_in = SimpleNamespace(
        param_groups=[{**{k: v for k, v in g.items() if k != 'params'},
                       'params': []} for g in groups],
        step=lambda: None)
    copies = []
    for scheduler in schedulers:
        twin = copy.copy(scheduler)
        twin.__dict__ = copy.deepcopy({k: v for k, v in
                                       scheduler.__dict__.items()
                                       if k != 'optimizer'})
        twin.optimizer = stand_in
        copies.append(twin)
    epoch_length = (None if _iter_based(runner.train_loop)
                    else len(runner.train_dataloader))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for i in range(runner.iter, runner.max_iters):
            if any(stand_in.param_groups[g].get('lr', 0) != 0
                   for g in trainable):
                return None
            due = [twin for twin in copies if not twin.by_epoch]
            if epoch_length and (i + 1) % epoch_length == 0:
                due += [twin for twin in copies if twin.by_epoch]
            for twin in due:
                try:
                    twin.step()
                except Exception as error:  # MMEngine's scheduler maths
                    raise RunSettingError(
                        f'param_scheduler[{copies.index(twin)}] '
                        f'({type(twin).__name__}) fails at its step after '
                        f'iteration {i + 1}: {type(error).__name__}: '
                        f'{error}; the run would stop there') from None
    return ', '.join(type(s).__name__ for s in schedulers)


def check_runner(runner) -> None:
    """The checks of :func:`check_run_settings` on what MMEngine built (so
    they hold for a runner made without a config file too), plus what only
    the built runner knows: the position a resumed checkpoint starts from
    and the learning rate the schedulers give over the run. (A stand-in
    runner without a training loop, as some tests build, is left alone.)"""
    loop = getattr(runner, 'train_loop', None)
    if loop is None:
        return
    _check_position(runner)
    if runner.val_loop is not None:
        check_interval(loop.val_interval, 'train_cfg.val_interval')
        _check_dynamic_intervals(
            list(zip(getattr(loop, 'dynamic_milestones', [])[1:],
                     getattr(loop, 'dynamic_intervals', [])[1:])),
            'train_cfg.dynamic_intervals')
    for where, wrapper in _optim_wrappers(runner):
        clip = getattr(wrapper, 'clip_grad_kwargs', None)
        if clip:
            kind = ('value' if getattr(wrapper, 'clip_func', None)
                    is torch.nn.utils.clip_grad_value_ else 'norm')
            check_clip_grad(dict(clip, type=kind), f'{where}.clip_grad')
        for i, group in enumerate(getattr(wrapper, 'param_groups', [])):
            check_lr(group.get('lr'), f'{where}.optimizer.lr (param group '
                     f'{i})')
    schedulers = runner.param_schedulers
    listed = (schedulers if isinstance(schedulers, list) else
              [s for v in (schedulers or {}).values() for s in v]
              if isinstance(schedulers, dict) else [])
    for i, scheduler in enumerate(listed):
        check_scheduler_factors(type(scheduler), vars(scheduler),
                                f'param_scheduler[{i}]')
    names = _zero_lr_run(runner)
    if names:
        rates = sorted({g.get('initial_lr', g.get('lr'))
                        for g in runner.optim_wrapper.param_groups})
        raise RunSettingError(
            f'param_scheduler ({names}) keeps the learning rate at 0 for all '
            f'{runner.max_iters - runner.iter} iterations of the run (the '
            f"optimizer's lr: {', '.join(map(repr, rates))}): nothing would "
            'be learned. Check the schedulers\' factors (e.g. '
            'ConstantLR factor=0, MultiStepLR gamma=0 at milestone 0) and '
            'their begin/end')

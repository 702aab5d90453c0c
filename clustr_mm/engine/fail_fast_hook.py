"""Stop a run at the first sign it cannot succeed, before it saves.

MMEngine trains on through a NaN loss and saves the non-finite weights (and
``max_keep_ckpts`` then rotates the good checkpoints out); a typo in a
``CheckpointHook`` option only fails at the first save, an epoch later.
mmdet's ``CheckInvalidLossHook`` exists in mmdet's scope only, checks every
50 iterations and does not say where; this hook serves all four libraries.
"""
import difflib
import inspect
import math

import torch
from mmengine.hooks import CheckpointHook, Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from .data_checks import leaf_datasets
from .run_settings import check_runner


class DivergedError(FloatingPointError):
    """Training produced a non-finite loss or non-finite weights."""


class CannotLearnError(RuntimeError):
    """The run has nothing to learn: an empty training set, no trainable
    parameter, every learning rate 0, or a loss of exactly 0 from the start
    (every target weighted 0)."""


def _train_data(runner) -> str:
    """'ann_file (Type)' of each training set under dataset wrappers."""
    loader = runner.cfg.get('train_dataloader') or {}
    names = [f'{d.get("data_root") or ""}'
             f'{d.get("ann_file") or d.get("split") or "(no ann_file)"} '
             f'({d.get("type")})' for d in leaf_datasets(loader.get('dataset'))]
    return ', '.join(names) or '(no dataset config)'


def training_position(runner) -> str:
    """'iteration N (epoch E)' of the running training iteration, 1-based as
    MMEngine logs them; '' before the first one."""
    hub = runner.message_hub
    if hub.get_info('iter') is None:
        return ''
    where = f'iteration {hub.get_info("iter") + 1}'
    if 'max_epochs' in (runner.cfg.get('train_cfg') or {}):
        where += f' (epoch {hub.get_info("epoch") + 1})'
    return where


@HOOKS.register_module(force=True)
class FailFastHook(Hook):
    """Refuse bad ``CheckpointHook`` options before training, stop at a
    non-finite loss, and never save non-finite parameters.

    Runs before the ``CheckpointHook`` (priority ``ABOVE_NORMAL`` against its
    ``VERY_LOW``), so the iteration whose loss is NaN/Inf is not saved. The
    loss is read after MMEngine's ``RuntimeInfoHook`` has copied it to the
    host for logging, so the check adds no device synchronisation.

    A run that cannot learn stops too, before anything is saved: an empty
    training set (every entry filtered out), a model with nothing to train
    (every parameter frozen, or every learning rate 0), settings with which
    the run goes nowhere (``run_settings.check_runner``: a resumed
    checkpoint that already reached ``max_epochs``, ``clip_grad.max_norm``
    0, ``val_interval`` 0, schedulers that keep the rate at 0, ...,
    raising ``RunSettingError`` before iteration 1), and a loss of
    exactly 0 in each of the first ``zero_loss_iters`` iterations (or in all
    of a shorter run, or of the first epoch): no real target gives that,
    while targets that all weigh 0 do (mmpose turns a NaN person box into
    target weights of 0).
    ``zero_loss_iters=0`` turns that check off.
    """

    priority = 'ABOVE_NORMAL'

    def __init__(self, zero_loss_iters: int = 10) -> None:
        if (isinstance(zero_loss_iters, bool)
                or not isinstance(zero_loss_iters, int)
                or zero_loss_iters < 0):
            raise ValueError(
                'FailFastHook: zero_loss_iters must be an int >= 0 (0: no '
                f'check), got {zero_loss_iters!r}')
        self.zero_loss_iters = zero_loss_iters
        self._zero_iters = 0  # iterations so far, all with a loss of 0
        self._learning = zero_loss_iters == 0

    def before_train(self, runner) -> None:
        dataset = runner.train_dataloader.dataset
        if len(dataset) == 0:
            raise CannotLearnError(
                f'the training set is empty: {_train_data(runner)} keeps 0 '
                'entries after its filters (filter_cfg='
                f'{getattr(dataset, "filter_cfg", None)}); nothing to train '
                'on')
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        if not any(p.requires_grad for p in model.parameters()):
            raise CannotLearnError(
                'no parameter of the model requires a gradient (every part '
                'frozen: frozen_stages, requires_grad=False, norm_eval...); '
                'nothing would be learned')
        # (an OptimWrapperDict of several optimizers has no param_groups of
        # its own: each of its wrappers is checked by its own training)
        groups = getattr(runner.optim_wrapper, 'param_groups', [])
        rates = [g.get('initial_lr', g.get('lr')) for g in groups
                 if any(p.requires_grad for p in g['params'])]
        if rates and all(r == 0 for r in rates):
            raise CannotLearnError(
                'every parameter group trains with a learning rate of 0 '
                '(optim_wrapper.optimizer.lr, or lr_mult=0 in '
                'optim_wrapper.paramwise_cfg): nothing would be learned')
        # settings with which the run goes nowhere (run_settings.py): a
        # resumed checkpoint at the end of the run, clipping by 0, ...
        check_runner(runner)

    def _zero_loss(self, runner, seen: str) -> CannotLearnError:
        return CannotLearnError(
            f'the loss was exactly 0 in {seen} ({self._zero_iters} '
            'iterations): nothing is learned and nothing was saved. Every '
            'target weighs 0; check the training annotations '
            f'{_train_data(runner)} (e.g. person boxes that are NaN, or '
            'no visible keypoint)')

    def before_run(self, runner) -> None:
        valid = [name for name in inspect.signature(
            runner.save_checkpoint).parameters
                 if name not in ('out_dir', 'filename')]
        for hook in runner.hooks:
            if not isinstance(hook, CheckpointHook):
                continue
            for key in getattr(hook, 'args', {}):
                if key not in valid:
                    near = difflib.get_close_matches(
                        key, valid + list(inspect.signature(
                            CheckpointHook).parameters), n=1)
                    hint = f' (did you mean {near[0]!r}?)' if near else ''
                    raise TypeError(
                        f'default_hooks.checkpoint: unknown option {key!r}'
                        f'{hint}; CheckpointHook takes the arguments of '
                        f'CheckpointHook.__init__ or of '
                        f'Runner.save_checkpoint ({", ".join(valid)})')

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        losses = {key: float(value.detach())
                  for key, value in (outputs or {}).items()
                  if 'loss' in key and isinstance(value, torch.Tensor)
                  and value.numel() == 1}
        bad = {k: v for k, v in losses.items() if not math.isfinite(v)}
        if not self._learning and losses and not bad:
            if any(losses.values()):
                self._learning = True
            else:
                self._zero_iters += 1
                limit = min(self.zero_loss_iters, runner.max_iters)
                if self._zero_iters >= limit:
                    raise self._zero_loss(
                        runner, f'each of the first {limit} iterations')
        if bad:
            shown = ', '.join(f'{k}={v}' for k, v in bad.items())
            raise DivergedError(
                f'training diverged at {training_position(runner)}: {shown}; '
                'nothing of this iteration was saved. Lower the learning rate '
                '(optim_wrapper.optimizer.lr) or clip gradients '
                '(optim_wrapper.clip_grad=dict(max_norm=...)) and resume '
                'from the last checkpoint')

    def after_train_epoch(self, runner) -> None:
        if not self._learning and self._zero_iters:
            raise self._zero_loss(runner, 'every iteration of the first epoch')

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        state = checkpoint.get('state_dict', {})
        bad = [name for name, _ in model.named_parameters()
               if name in state and not torch.isfinite(state[name]).all()]
        if bad:
            more = f' and {len(bad) - 3} more' if len(bad) > 3 else ''
            done = checkpoint.get('meta', {}).get('iter', runner.iter)
            raise DivergedError(
                f'training diverged: after {done} iterations the parameters '
                f'{", ".join(bad[:3])}{more} are not finite; the checkpoint '
                'was not saved')

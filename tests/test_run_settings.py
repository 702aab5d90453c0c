"""Settings with which a training run goes nowhere are refused before
iteration 1, naming the setting (issue 56, class 1;
``clustr_mm/engine/run_settings.py``).

Two doors: :func:`check_run_settings` on the config (``tools/train.py``,
before anything is built) and ``FailFastHook.before_train`` on the built
runner (every runner whose config lists the hook: the shipped configs, what
``tools/train.py`` and the analysis tools' short runs build, the libraries'
own tools). The runner tests train a two-weight toy model in this process;
the tool test starts ``tools/train.py`` and is in the slow tier.
"""
import math
import re

import pytest
import torch
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.runner import Runner

import clustr_mm  # noqa: F401  (registers FailFastHook)
from clustr_mm.engine.run_settings import (RunSettingError,
                                           check_run_settings)

from conftest import run_tool

EMBEDDED = 'configs/paca/paca-t_embedded-imagenet.py'


class _Toy(BaseModel):
    """y = w.x with an MSE loss; counts its training forwards."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        self.calls = 0

    def forward(self, inputs, targets=None, mode='loss'):
        if mode == 'loss':
            self.calls += 1
            return dict(loss=(self.linear(inputs).squeeze(1)
                              - targets).square().mean())
        return [dict(pred=self.linear(inputs))]


class _Metric(BaseMetric):
    def process(self, data_batch, data_samples):
        self.results.append(0.0)

    def compute_metrics(self, results):
        return dict(zero=0.0)


_COUNT = [0]


def _loader(batch_size=2, drop_last=False, n=8):
    data = [dict(inputs=torch.randn(2), targets=torch.randn(()))
            for _ in range(n)]
    return dict(dataset=data, batch_size=batch_size, drop_last=drop_last,
                sampler=dict(type='DefaultSampler', shuffle=False),
                collate_fn=dict(type='default_collate'))


def _runner(tmp_path, model, by_epoch=True, length=2, validate=False,
            optim=None, schedulers=None, loader=None, **cfg):
    _COUNT[0] += 1
    train_cfg = (dict(by_epoch=True, max_epochs=length) if by_epoch else
                 dict(by_epoch=False, max_iters=length))
    train_cfg.update(cfg.pop('train_cfg', {}))
    extra = dict(val_dataloader=_loader(), val_cfg=dict(),
                 val_evaluator=[_Metric()]) if validate else {}
    return Runner(
        model=model, work_dir=str(tmp_path),
        experiment_name=f'run_settings_{_COUNT[0]}',
        train_dataloader=loader or _loader(), train_cfg=train_cfg,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01),
                           **(optim or {})),
        param_scheduler=schedulers,
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1,
                                           by_epoch=by_epoch)),
        custom_hooks=[dict(type='FailFastHook')], **extra, **cfg)


def _refused(runner, model, pattern):
    with pytest.raises(RunSettingError, match=pattern):
        runner.train()
    assert model.calls == 0  # before iteration 1


def _cfg(**parts):
    base = dict(train_cfg=dict(max_epochs=2),
                optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
                train_dataloader=dict(batch_size=2))
    base.update(parts)
    return Config(base)


def _static_refused(pattern, **parts):
    with pytest.raises(RunSettingError, match=pattern):
        check_run_settings(_cfg(**parts))


# --- clip_grad ---------------------------------------------------------------
@pytest.mark.parametrize('clip, pattern', [
    (dict(max_norm=0), r'optim_wrapper\.clip_grad\.max_norm=0 multiplies '
     r'every gradient by 0: only weight decay would move the weights'),
    (dict(max_norm=-1.0), r'max_norm=-1\.0 turns every gradient round'),
    (dict(max_norm=math.nan), r'max_norm=nan makes every gradient NaN'),
    (dict(max_norm='1'), r"max_norm='1' is not a number"),
    (dict(type='value', clip_value=0), r'clip_grad\.clip_value=0 '
     r'multiplies every gradient by 0'),
    (dict(type='value', clip_value=-1), r'clip_value=-1 sets every gradient '
     'to the same value -1'),
    (dict(norm_type=2), r"has no max_norm: clipping by norm needs "
     r'optim_wrapper\.clip_grad\.max_norm=N'),
    (dict(max_nrom=1.0), r"unknown option 'max_nrom' \(did you mean "
     r"'max_norm'\?\)"),
    (dict(type='global', max_norm=1.0), r"clip_grad\.type='global'"),
])
def test_clipping_that_zeroes_or_reverses_gradients_is_refused(clip,
                                                               pattern):
    _static_refused(pattern, optim_wrapper=dict(
        optimizer=dict(type='SGD', lr=0.01), clip_grad=clip))


def test_clipping_limits_that_train_pass():
    for clip in (None, dict(max_norm=1.0), dict(max_norm=35, norm_type=2),
                 dict(max_norm=math.inf), dict(type='value', clip_value=0.5)):
        check_run_settings(_cfg(optim_wrapper=dict(
            optimizer=dict(type='SGD', lr=0.01), clip_grad=clip)))
    # a wrapper per optimizer (MultiOptimWrapperConstructor) is named
    _static_refused(r'optim_wrapper\.head\.clip_grad\.max_norm=0',
                    optim_wrapper=dict(
                        constructor='MultiOptimWrapperConstructor',
                        head=dict(optimizer=dict(type='SGD', lr=0.1),
                                  clip_grad=dict(max_norm=0))))


def test_clip_grad_max_norm_0_stops_the_runner(tmp_path):
    model = _Toy()
    _refused(_runner(tmp_path, model, optim=dict(clip_grad=dict(max_norm=0))),
             model, r'optim_wrapper\.clip_grad\.max_norm=0 multiplies every '
             'gradient by 0')


# --- resume past the end of the run ------------------------------------------
@pytest.mark.parametrize('by_epoch', [True, False])
def test_resuming_a_finished_run_is_refused(tmp_path, by_epoch):
    first = _runner(tmp_path, _Toy(), by_epoch, length=2 if by_epoch else 4)
    first.train()
    name = 'epoch_2.pth' if by_epoch else 'iter_4.pth'
    key, saved = (('max_epochs', r'2 epochs \(8 iterations\)') if by_epoch
                  else ('max_iters', '4 iterations'))
    for length in ((1, 2) if by_epoch else (3, 4)):
        model = _Toy()
        runner = _runner(tmp_path, model, by_epoch, length=length,
                         resume=True, load_from=str(tmp_path / name))
        _refused(runner, model, re.escape(str(tmp_path / name)) +
                 f', saved after {saved}, with train_cfg.{key}={length}: '
                 r'nothing is left to train .*raise train_cfg\.'
                 f'{key} above {2 if by_epoch else 4}')
    # a longer run continues from it
    model = _Toy()
    _runner(tmp_path, model, by_epoch, length=3 if by_epoch else 5,
            resume=True, load_from=str(tmp_path / name)).train()
    assert model.calls == (4 if by_epoch else 1)


# --- the run's length --------------------------------------------------------
def test_an_epoch_without_batches_is_refused(tmp_path):
    model = _Toy()
    _refused(_runner(tmp_path, model, loader=_loader(16, drop_last=True)),
             model, r'train_dataloader gives 0 batches per epoch: '
             r'batch_size=16 with drop_last=True over 8 samples')


@pytest.mark.parametrize('loader', ['train_dataloader', 'val_dataloader'])
@pytest.mark.parametrize('size', [0, -2, 1.5])
def test_a_batch_size_below_1_is_refused(loader, size):
    parts = dict(val_cfg=dict(), val_dataloader=dict(batch_size=2))
    parts[loader] = dict(batch_size=size)
    _static_refused(rf'{loader}\.batch_size={size!r}: must be an int >= 1',
                    **parts)


# --- validation interval -----------------------------------------------------
@pytest.mark.parametrize('value', [0, -1, 1.5])
def test_a_validation_interval_below_1_is_refused(value):
    _static_refused(
        rf'train_cfg\.val_interval={value!r}: the run would fail at its '
        r'first validation .* must be an int >= 1',
        train_cfg=dict(max_epochs=2, val_interval=value), val_cfg=dict(),
        val_dataloader=dict(batch_size=2))
    # without validation the interval is not used
    check_run_settings(_cfg(train_cfg=dict(max_epochs=2,
                                           val_interval=value)))


def test_a_dynamic_interval_of_0_is_refused():
    _static_refused(r'train_cfg\.dynamic_intervals\[0\]\[1\]=0',
                    train_cfg=dict(max_epochs=2, val_interval=1,
                                   dynamic_intervals=[(1, 0)]),
                    val_cfg=dict(), val_dataloader=dict(batch_size=2))


def test_val_interval_0_stops_the_runner(tmp_path):
    model = _Toy()
    _refused(_runner(tmp_path, model, validate=True,
                     train_cfg=dict(val_interval=0)),
             model, r'train_cfg\.val_interval=0: the run would fail at its '
             'first validation')


# --- learning rates and schedulers -------------------------------------------
def test_a_learning_rate_that_is_not_finite_is_refused(tmp_path):
    _static_refused(r'optim_wrapper\.optimizer\.lr=inf: the first step would '
                    'make the weights inf or NaN',
                    optim_wrapper=dict(optimizer=dict(type='SGD',
                                                      lr=math.inf)))
    _static_refused(r'optim_wrapper\.optimizer\.lr=nan',  # SGD takes it
                    optim_wrapper=dict(optimizer=dict(type='SGD',
                                                      lr=math.nan)))
    model = _Toy()
    runner = _runner(tmp_path, model)
    runner.optim_wrapper = dict(optimizer=dict(type='SGD', lr=math.inf))
    _refused(runner, model, r'optim_wrapper\.optimizer\.lr \(param group 0\)'
             '=inf')


def test_scheduler_factors_mmengine_divides_by_are_refused(tmp_path):
    warmup = dict(type='LinearLR', start_factor=0, by_epoch=False, begin=0,
                  end=4)
    _static_refused(r"param_scheduler\[0\]\.start_factor=0: MMEngine's "
                    r'LinearLR divides by this factor, so the run would fail '
                    'with ZeroDivisionError after iteration 1',
                    param_scheduler=[warmup])
    model = _Toy()
    _refused(_runner(tmp_path, model, schedulers=[warmup]), model,
             r'param_scheduler\[0\]\.start_factor=0')
    constant = dict(type='ConstantLR', factor=0, by_epoch=False)
    _static_refused(r"param_scheduler\.factor=0: MMEngine's ConstantLR "
                    r'divides by this factor, so the run would fail with '
                    'ZeroDivisionError at its end, after training at a '
                    'learning rate of 0 until then', param_scheduler=constant)
    model = _Toy()
    _refused(_runner(tmp_path, model, schedulers=[constant]), model,
             r'param_scheduler\[0\]\.factor=0: MMEngine\'s ConstantLR')


@pytest.mark.parametrize('schedulers', [
    [dict(type='MultiStepLR', milestones=[0], gamma=0, by_epoch=False)],
    [dict(type='LinearLR', start_factor=1e-3, by_epoch=False, end=2),
     dict(type='MultiStepLR', milestones=[0], gamma=0, by_epoch=True)],
])
def test_schedulers_that_keep_the_rate_at_0_are_refused(tmp_path,
                                                        schedulers):
    model = _Toy()
    _refused(_runner(tmp_path, model, schedulers=schedulers), model,
             r'param_scheduler \(.*\) keeps the learning rate at 0 for all 8 '
             r'iterations of the run .*nothing would be learned')


@pytest.mark.parametrize('schedulers', [
    [dict(type='LinearLR', start_factor=1e-3, by_epoch=False, end=4),
     dict(type='CosineAnnealingLR', eta_min=0, by_epoch=True, begin=0)],
    [dict(type='PolyLR', eta_min=0, power=1.0, by_epoch=False)],
    # a warm-up from a tiny factor: the rate is small, not 0
    [dict(type='LinearLR', start_factor=1e-6, by_epoch=False, end=4)],
])
def test_schedulers_that_reach_a_rate_pass(tmp_path, schedulers):
    model = _Toy()
    _runner(tmp_path, model, schedulers=schedulers).train()
    assert model.calls == 8


def test_amp_loss_scale_and_auto_scale_base_below_1_are_refused():
    _static_refused(r"optim_wrapper\.loss_scale=0\.0: .*every step skipped; "
                    r"use a number > 0 \(e\.g\. 512\.\) or 'dynamic'",
                    optim_wrapper=dict(type='AmpOptimWrapper', loss_scale=0.,
                                       optimizer=dict(type='SGD', lr=0.1)))
    _static_refused(r'optim_wrapper\.loss_scale\.init_scale=0',
                    optim_wrapper=dict(type='AmpOptimWrapper',
                                       loss_scale=dict(init_scale=0),
                                       optimizer=dict(type='SGD', lr=0.1)))
    _static_refused(r'auto_scale_lr\.base_batch_size=0: --auto-scale-lr '
                    'divides the batch size of the run by it',
                    auto_scale_lr=dict(enable=True, base_batch_size=0))
    check_run_settings(_cfg(auto_scale_lr=dict(enable=False,
                                               base_batch_size=0)))


# --- through tools/train.py --------------------------------------------------
@pytest.mark.slow  # starts tools/train.py twice (refused before any build)
def test_train_tool_refuses_runs_that_go_nowhere(tmp_path):
    for option, message in [
            ('optim_wrapper.clip_grad.max_norm=0',
             'optim_wrapper.clip_grad.max_norm=0 multiplies every gradient '
             'by 0'),
            ('train_cfg.val_interval=0',
             'train_cfg.val_interval=0: the run would fail at its first '
             'validation')]:
        out = run_tool(['tools/train.py', EMBEDDED, '--work-dir',
                        str(tmp_path), '--cfg-options', option], check=False)
        assert out.returncode == 1, out.stdout
        assert f'[train] {EMBEDDED}: {message}' in out.stdout, out.stdout
        assert 'Traceback' not in out.stdout
        assert not list(tmp_path.glob('*.pth'))


@pytest.mark.slow  # trains the embedded PaCa-T an epoch (shared short_run)
def test_train_tool_refuses_to_resume_a_finished_run(short_run, tmp_path):
    """The issue's case: a checkpoint of the last epoch resumed with the
    same max_epochs trained nothing, saved nothing and said nothing."""
    ckpt = short_run(EMBEDDED)[1]
    out = run_tool(['tools/train.py', EMBEDDED, '--work-dir', str(tmp_path),
                    '--resume', ckpt, '--cfg-options',
                    'train_cfg.max_epochs=1'], check=False)
    assert out.returncode == 1, out.stdout
    assert re.search(rf'\[train\] {EMBEDDED}: resuming {re.escape(ckpt)}, '
                     r'saved after 1 epoch \(\d+ iterations\), with '
                     r'train_cfg\.max_epochs=1: nothing is left to train',
                     out.stdout), out.stdout[-3000:]
    assert not list(tmp_path.glob('*.pth'))

"""Train a config for exactly N iterations with the normal runner machinery.

Shared by ``tools/analysis/nan_check.py`` and ``tools/analysis/memory_soak.py``:
the config is trained as ``tools/train.py`` would (same loop, schedulers,
optimizer wrapper, data pipeline), except that validation and checkpoint
saving are switched off and the run stops after ``iters`` iterations. An
epoch-based config gets enough epochs for ``iters`` iterations; its
parameter schedulers are left as written, so the first iterations follow the
config's own schedule (past a scheduler's ``end`` the value stays put).
"""
import tempfile
from typing import Iterable, Optional

from mmengine.config import Config
from mmengine.hooks import Hook

from .launch import build_runner


class _Stop(Exception):
    """Raised by :class:`StopAfterHook` once the iterations are done."""


class StopAfterHook(Hook):
    """End training after ``iters`` iterations (all other hooks of the last
    iteration have run: lowest priority)."""

    priority = 'LOWEST'

    def __init__(self, iters: int):
        self.iters = iters

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        # runner.iter counts the finished iterations minus one here.
        if runner.iter + 1 >= self.iters:
            raise _Stop


def prepare_short_run(cfg: Config, iters: int) -> Config:
    """Edit ``cfg`` in place for an ``iters``-iteration run; returns it."""
    if iters < 1:
        raise ValueError(f'iters must be >= 1, got {iters}')
    loop = cfg.train_cfg
    if 'max_iters' in loop:
        loop.max_iters = max(int(loop.max_iters), iters)
    else:  # epoch-based: every epoch has at least one iteration
        loop.max_epochs = max(int(loop.get('max_epochs', 1)), iters)
    loop.val_begin = 2**31  # no validation inside the run
    cfg.default_hooks = cfg.get('default_hooks') or {}
    cfg.default_hooks.checkpoint = None  # nothing written to disk
    return cfg


def run_short(cfg: Config, iters: int, hooks: Iterable[Hook] = (),
              work_dir: Optional[str] = None):
    """Build the runner, register ``hooks``, train ``iters`` iterations.

    ``work_dir`` (default: a new temporary directory) receives the logs.
    Returns the runner. Exceptions raised by a hook (e.g. a failed check)
    propagate.
    """
    cfg.work_dir = work_dir or tempfile.mkdtemp(prefix='clustr_mm_short_run_')
    prepare_short_run(cfg, iters)
    runner = build_runner(cfg)
    for hook in hooks:
        runner.register_hook(hook)
    runner.register_hook(StopAfterHook(iters))
    try:
        runner.train()
    except _Stop:
        pass
    return runner

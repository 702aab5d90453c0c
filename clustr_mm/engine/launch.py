"""What tools/train.py and tools/test.py share: config loading and launch set-up.

The four OpenMMLab libraries ship near-identical train/test scripts; one pair
serves them all here. The config's ``default_scope`` names the library, and the
few behaviours that differ per library are dispatched on it.
"""
import argparse
import importlib
import os
import os.path as osp
import re

import torch
from mmengine.config import Config, DictAction
from mmengine.registry import DefaultScope
from torch import nn

from ..env_check import check_scope
from ..models.heads import LAZY_HEADS
from ..registry import skip_note
from .cli_args import work_dir as work_dir_arg
from .options import (check_config_switches, check_work_dir,
                      merge_cfg_options)
from .run_settings import check_train_length  # noqa: F401  (moved there)

SCOPES = ('mmpretrain', 'mmdet', 'mmseg', 'mmpose')


def build_in_scope(model_cfg, scope: str) -> nn.Module:
    """``model_cfg`` built by the MODELS registry of library ``scope`` (one
    of :data:`SCOPES`), its modules registered and its scope current: how
    the analysis and export tools build a config's model without a
    runner."""
    importlib.import_module(f'{scope}.utils').register_all_modules(False)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        return registry.build(model_cfg)


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('config', help='config file path')
    parser.add_argument(
        '--work-dir', type=work_dir_arg, help='where logs and checkpoints go '
        '(default: work_dirs/<config name>)')
    parser.add_argument(
        '--cfg-options', nargs='+', action=DictAction, default={},
        help='override config entries, e.g. train_cfg.max_iters=10')
    parser.add_argument(
        '--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none', help='job launcher')
    # torch.distributed.launch passes --local-rank; torchrun sets LOCAL_RANK.
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)


def read_config(path: str) -> Config:
    """``Config.fromfile(path)``; a base config that cannot be found is
    named with the ``scope::path`` references of the file (MMEngine names
    only the resolved path inside the installed library)."""
    try:
        return Config.fromfile(path)
    except FileNotFoundError as err:
        with open(path) as f:
            refs = re.findall(r'''['"]([\w-]+::[^'"]+)['"]''', f.read())
        hint = (f'; it inherits {", ".join(refs)} (scope::path: a config '
                "inside the installed library's configs folder; check the "
                'path there)' if refs else '')
        raise FileNotFoundError(
            f'{path}: a config it inherits cannot be found: {err}{hint}'
        ) from None


def load_config(args: argparse.Namespace) -> Config:
    """Read the config, apply overrides, set work dir and launcher."""
    if not osp.isfile(args.config):
        raise FileNotFoundError(f'config file not found: {args.config}')
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    cfg = read_config(args.config)
    merge_cfg_options(cfg, args.cfg_options, args.config)
    check_config_switches(cfg, args.config)
    scope = cfg.get('default_scope')
    if scope not in SCOPES:
        raise ValueError(
            f'{args.config}: default_scope must be one of {SCOPES}, got '
            f'{scope!r} (inherit a base config of the task library)')
    # now, not when MMEngine first switches to the scope: it would hide a
    # library that does not import behind a registry KeyError
    check_scope(scope)
    cfg.launcher = args.launcher
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    check_work_dir(cfg.work_dir, '--work-dir' if args.work_dir is not None
                   else '--cfg-options work_dir' if 'work_dir' in
                   args.cfg_options else f'work_dir in {args.config}')
    if args.launcher != 'none' and not torch.cuda.is_available():
        prepare_cpu_distributed(cfg)
    return cfg


#: What every training run gets (the shipped configs list them; a config of
#: one's own gets them from tools/train.py): resume that continues the random
#: streams, and a stop at a non-finite loss before it is saved.
RUN_HOOKS = ('RandomStateHook', 'FailFastHook')


def add_run_hooks(cfg: Config) -> None:
    """Append the :data:`RUN_HOOKS` missing from ``cfg.custom_hooks``."""
    hooks = list(cfg.get('custom_hooks') or [])
    present = {h.get('type') for h in hooks}
    cfg.custom_hooks = hooks + [dict(type=name) for name in RUN_HOOKS
                                if name not in present]


def _sync_bn_to_bn(node):
    """SyncBatchNorm needs GPUs; plain BN is what a CPU process group can run."""
    if isinstance(node, dict):
        if node.get('type') in ('SyncBN', 'MMSyncBN'):
            node['type'] = 'BN'
        for value in node.values():
            _sync_bn_to_bn(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _sync_bn_to_bn(value)


def prepare_cpu_distributed(cfg: Config) -> None:
    """Make a multi-process run work without GPUs (gloo, no device_ids).

    MMEngine's ``init_dist`` calls ``torch.cuda.set_device`` and its DDP
    wrapper passes ``device_ids=[LOCAL_RANK]``; both fail on CPU. We start the
    gloo process group ourselves (the runner then skips ``init_dist``) and
    wrap without device ids.
    """
    import torch.distributed as dist
    if not dist.is_initialized():
        dist.init_process_group(backend='gloo')
    cfg.env_cfg = cfg.get('env_cfg', {})
    cfg.env_cfg.setdefault('dist_cfg', {})['backend'] = 'gloo'
    wrapper = cfg.get('model_wrapper_cfg') or dict(
        type='MMDistributedDataParallel', broadcast_buffers=False,
        find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper['device_ids'] = None
    cfg.model_wrapper_cfg = wrapper
    _sync_bn_to_bn(cfg.model)


def finish_distributed() -> None:
    """Tear the process group down before exit.

    Left to interpreter shutdown, gloo's threads can be destroyed while still
    joinable, which aborts the process ("terminate called without an active
    exception") after a successful run.
    """
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def build_runner(cfg: Config):
    """Use the config's custom runner type if it names one (as mmdet does).

    Checks the config's task library first, as :func:`load_config` does,
    for the tools that build a runner from a config they read themselves
    (``train_speed.py``, ``nan_check.py``): MMEngine switches to a scope
    whose package does not import with a warning only, then fails on a
    registry KeyError (seen on a GPU image without mmpretrain's
    ``modelindex``: 'UniversalVisualizer is not in the mmengine::visualizer
    registry')."""
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner
    check_scope(cfg.get('default_scope'))
    try:
        if 'runner_type' in cfg:
            return RUNNERS.build(cfg)
        return Runner.from_cfg(cfg)
    except KeyError as error:
        note = skip_note('lazy_heads')
        if note and any(name in str(error) for name in LAZY_HEADS):
            raise KeyError(f'{error.args[0] if error.args else error}'
                           f'{note}') from error
        raise

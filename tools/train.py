"""Train any clustr_mm config (mmpretrain, mmdet, mmseg or mmpose).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [auto|CKPT]] [--amp]
    bash tools/dist_train.sh CONFIG GPUS [args]       # torchrun; CPU: gloo
"""
import argparse
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import clustr_mm  # noqa: E402,F401  (registers models, safe resume)
from clustr_mm.checkpoints import add_coverage_check  # noqa: E402
from clustr_mm.engine.amp import use_amp  # noqa: E402
from clustr_mm.engine.data_checks import DataCheckError, check_data  # noqa: E402
from clustr_mm.engine.atomic_io import sweep_stale_temporaries  # noqa: E402
from clustr_mm.engine.fail_fast_hook import (  # noqa: E402
    CannotLearnError, DivergedError, training_position)
from clustr_mm.engine.launch import (  # noqa: E402
    add_common_args, add_run_hooks, build_runner, finish_distributed,
    load_config)
from clustr_mm.engine.run_settings import (  # noqa: E402
    RunSettingError, check_run_settings)
from clustr_mm.engine.resume import (  # noqa: E402
    checkpoint_in_folder, choose_resume_checkpoint, explain_unreadable,
    read_resume_meta)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument(
        '--resume', nargs='?', const='auto', default=None,
        help="resume from CKPT, or with no value ('auto') from the latest "
        'checkpoint in the work dir; a folder: its latest checkpoint, '
        'chosen alike (the newest epoch_N/iter_N or the one its '
        'last_checkpoint names), else its newest .pth file')
    parser.add_argument(
        '--amp', action='store_true',
        help="mixed precision: on a GPU MMEngine's AmpOptimWrapper (the "
        "config's dtype, default fp16 with dynamic loss scaling), on a CPU "
        'bf16 autocast without loss scaling (CPUAmpOptimWrapper)')
    parser.add_argument(
        '--auto-scale-lr', action='store_true',
        help='scale the lr by actual/base batch size (configs with '
        'auto_scale_lr: mmpretrain, mmdet, mmpose)')
    parser.add_argument(
        '--allow-partial-load', action='store_true',
        help='accept a load_from checkpoint that leaves model weights '
        'unloaded (e.g. a detector with other classes; refused by default)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args)
    if args.amp:
        print(f'[train] --amp: {use_amp(cfg)}', flush=True)
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg:
            raise ValueError(
                f'--auto-scale-lr: {args.config} has no auto_scale_lr '
                f'(default_scope {cfg.default_scope}); add '
                'auto_scale_lr = dict(base_batch_size=...) to the config')
        cfg.auto_scale_lr.enable = True
    try:  # settings with which the run would go nowhere, before any build
        check_run_settings(cfg)
    except RunSettingError as err:
        sys.exit(f'[train] {args.config}: {err}')

    add_run_hooks(cfg)
    add_coverage_check(cfg, args.allow_partial_load)
    if args.resume is not None:
        resume(cfg, args.resume)

    try:
        check_data(cfg, ['train_dataloader'] + (
            ['val_dataloader'] if cfg.get('val_cfg') else []))
    except DataCheckError as err:
        sys.exit(f'[train] {args.config}: {err}')

    runner = build_runner(cfg)
    if runner.rank == 0:
        dist = torch.distributed
        backend = (f' ({dist.get_backend()})' if dist.is_available()
                   and dist.is_initialized() else '')
        print(f'[train] {args.config} ({cfg.default_scope}): launcher '
              f'{args.launcher}, world size {runner.world_size}{backend}, '
              f'work dir {runner.work_dir}', flush=True)
        for path in sweep_stale_temporaries(runner.work_dir):
            print(f'[train] removed {path}, left by a save that was killed',
                  flush=True)
    try:
        runner.train()
    except (DivergedError, CannotLearnError, RunSettingError) as err:
        sys.exit(f'[train] {args.config}: {err}')
    except Exception:
        where = training_position(runner)
        if where:
            print(f'[train] {args.config}: stopped at {where}', flush=True)
        raise
    finish_distributed()


def resume(cfg, choice: str) -> None:
    """Point ``cfg`` at the checkpoint to continue from ('auto': the newest
    readable one in the work dir) and restore the seed it was trained with.
    """
    if choice == 'auto':
        path, meta = choose_resume_checkpoint(cfg.work_dir)
        if path is None:
            print(f'[train] --resume: no checkpoint in {cfg.work_dir}, '
                  'starting from scratch', flush=True)
            return
    elif not choice.strip():
        raise ValueError(
            f"--resume {choice!r} is empty: give a checkpoint file or a "
            "folder of checkpoints, or --resume alone for the work dir's "
            'latest')
    elif osp.isdir(choice):
        path, meta = checkpoint_in_folder(choice)
    else:
        path = choice
        if not osp.isfile(path):
            raise FileNotFoundError(f'--resume: no checkpoint at {path}')
        try:
            meta = read_resume_meta(path)
        except ValueError as err:
            raise explain_unreadable(path, err) from None
    print(f'[train] --resume: continuing from {path}', flush=True)
    cfg.resume, cfg.load_from = True, path
    # names every optimizer / scheduler setting the checkpoint replaces
    hooks = list(cfg.get('custom_hooks') or [])
    if not any(h.get('type') == 'ResumeSettingsHook' for h in hooks):
        cfg.custom_hooks = [*hooks, dict(type='ResumeSettingsHook')]
    seed = meta.get('seed')
    randomness = cfg.get('randomness') or {}
    if seed is not None and randomness.get('seed') != seed:
        if randomness.get('seed') is not None:
            print(f"[train] --resume: the checkpoint's seed {seed} replaces "
                  f"randomness.seed={randomness['seed']}", flush=True)
        cfg.randomness = dict(randomness, seed=seed)


if __name__ == '__main__':
    main()

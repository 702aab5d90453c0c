"""Train any clustr_mm config (mmpretrain, mmdet, mmseg or mmpose).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [auto|CKPT]] [--amp]
    bash tools/dist_train.sh CONFIG GPUS [args]       # torchrun; CPU: gloo
"""
import argparse
import os
import os.path as osp
import re
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import torch  # noqa: E402

import clustr_mm  # noqa: E402,F401  (registers models, safe resume)
from clustr_mm.engine.launch import (  # noqa: E402
    add_common_args, build_runner, finish_distributed, load_config)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument(
        '--resume', nargs='?', const='auto', default=None,
        help="resume from CKPT, or with no value ('auto') from the latest "
        'checkpoint in the work dir')
    parser.add_argument(
        '--amp', action='store_true',
        help='mixed precision (fp16 on GPU, bf16 on CPU)')
    parser.add_argument(
        '--auto-scale-lr', action='store_true',
        help='scale the lr by actual/base batch size (configs with '
        'auto_scale_lr: mmpretrain, mmdet, mmpose)')
    return parser.parse_args(argv)


def latest_checkpoint(work_dir):
    """The checkpoint to resume from: the one ``last_checkpoint`` names, or,
    if a run was killed between writing a checkpoint and that pointer, the
    newest ``epoch_N``/``iter_N`` file (complete: writes are atomic)."""
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        with open(pointer) as f:
            named = f.read().strip()
        if osp.isfile(named):
            return named
    found = [(int(m.group(2)), m.group(1) == 'iter', name)
             for name in (os.listdir(work_dir) if osp.isdir(work_dir) else [])
             for m in [re.fullmatch(r'(epoch|iter)_(\d+)\.pth', name)] if m]
    return osp.join(work_dir, max(found)[2]) if found else None


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args)

    if args.amp:
        wrapper = cfg.optim_wrapper
        if wrapper.get('type', 'OptimWrapper') == 'AmpOptimWrapper':
            print('[train] --amp: config already uses AmpOptimWrapper')
        else:
            wrapper.type = 'AmpOptimWrapper'
            wrapper.setdefault('loss_scale', 'dynamic')
        if not torch.cuda.is_available():
            wrapper.dtype = 'bfloat16'  # fp16 autocast is GPU-only
    if args.auto_scale_lr:
        if 'auto_scale_lr' not in cfg:
            raise ValueError(
                f'--auto-scale-lr: {args.config} has no auto_scale_lr '
                f'(default_scope {cfg.default_scope}); add '
                'auto_scale_lr = dict(base_batch_size=...) to the config')
        cfg.auto_scale_lr.enable = True

    # Checkpoints carry the RNG states, so a resumed run continues exactly.
    hooks = cfg.get('custom_hooks') or []
    if not any(h.get('type') == 'RandomStateHook' for h in hooks):
        cfg.custom_hooks = [*hooks, dict(type='RandomStateHook')]

    if args.resume == 'auto':
        latest = latest_checkpoint(cfg.work_dir)
        if latest is None:
            print(f'[train] --resume: no checkpoint in {cfg.work_dir}, '
                  'starting from scratch', flush=True)
        else:
            print(f'[train] --resume: continuing from {latest}', flush=True)
            cfg.resume, cfg.load_from = True, latest
    elif args.resume is not None:
        if not osp.isfile(args.resume):
            raise FileNotFoundError(f'--resume: no checkpoint at {args.resume}')
        cfg.resume, cfg.load_from = True, args.resume

    runner = build_runner(cfg)
    if runner.rank == 0:
        print(f'[train] {args.config} ({cfg.default_scope}): launcher '
              f'{args.launcher}, world size {runner.world_size}, work dir '
              f'{runner.work_dir}', flush=True)
    runner.train()
    finish_distributed()


if __name__ == '__main__':
    main()

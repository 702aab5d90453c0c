"""Train any clustr_mm config (mmpretrain, mmdet, mmseg or mmpose).

    python tools/train.py CONFIG [--work-dir DIR] [--resume [auto|CKPT]] [--amp]
    bash tools/dist_train.sh CONFIG GPUS [args]       # torchrun; CPU: gloo
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import torch  # noqa: E402

import clustr_mm  # noqa: E402,F401  (registers models, safe resume)
from clustr_mm.utils.launch import (add_common_args, build_runner,  # noqa: E402
                                    load_config)


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

    if args.resume == 'auto':
        cfg.resume, cfg.load_from = True, None
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


if __name__ == '__main__':
    main()

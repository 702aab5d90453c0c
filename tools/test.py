"""Evaluate a checkpoint of any clustr_mm config with its library's metric.

    python tools/test.py CONFIG CHECKPOINT_OR_URL [--work-dir DIR]
        [--allow-partial-load]
    bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [args]
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import clustr_mm  # noqa: E402,F401  (registers models)
from clustr_mm.checkpoints import add_coverage_check  # noqa: E402
from clustr_mm.engine.data_checks import DataCheckError, check_data  # noqa: E402
from clustr_mm.engine.launch import (  # noqa: E402
    add_common_args, build_runner, finish_distributed, load_config)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument(
        'checkpoint', help='checkpoint file or http(s) URL to evaluate '
        '(official PaCa-ViT files are converted on load; see docs/weights.md)')
    parser.add_argument(
        '--allow-partial-load', action='store_true',
        help='evaluate even if the checkpoint leaves model weights unloaded '
        '(refused by default)')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    cfg = load_config(args)
    cfg.load_from = args.checkpoint  # read (and checked) by clustr_mm's loader
    add_coverage_check(cfg, args.allow_partial_load)
    try:
        check_data(cfg, ['test_dataloader'])
    except DataCheckError as err:
        sys.exit(f'[test] {args.config}: {err}')
    runner = build_runner(cfg)
    metrics = runner.test()
    finish_distributed()
    line = f'[test] {args.config}: ' + ', '.join(
        f'{k}={v:.4f}' if isinstance(v, float) else f'{k}={v}'
        for k, v in metrics.items())
    # one write, newline included: every rank prints this line, and print()'s
    # separate newline let two ranks' lines run together on a busy machine
    sys.stdout.write(line + '\n')
    sys.stdout.flush()
    return metrics


if __name__ == '__main__':
    main()

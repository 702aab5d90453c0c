"""Show that a config learns: evaluate the freshly initialised model, train,
evaluate again, and compare the library's own metric; also report how far
each part of the model (backbone, neck, heads) moved from its initial
weights (``weight_change``: a part that did not train reads about 0).

    python tools/analysis/learning_check.py CONFIG --metric KEY [--min-gain G]
        [--work-dir DIR] [--cfg-options k=v ...]

Meant for the ``*_embedded-*`` configs (minutes on a CPU). Exits 1 when the
metric did not rise by at least ``--min-gain``.
"""
import argparse
import json
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import clustr_mm  # noqa: E402,F401
from clustr_mm.engine.cli_args import non_negative_float  # noqa: E402
from clustr_mm.engine.launch import (  # noqa: E402
    add_common_args, build_runner, load_config)


def _numbers(metrics):
    """The numeric entries of a metrics dict, as JSON-ready floats."""
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float)) or hasattr(v, '__float__')}


def _weights(model):
    """A copy of every parameter, by name (what training may change)."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def weight_change(before, model):
    """Per top-level part of the model (backbone, neck, heads...): the
    relative change ||w_end - w_start|| / ||w_start|| of its parameters over
    the run. A part whose weights never changed (frozen, or no gradient
    reached it) reads 0; weight decay alone moves it by about lr x decay per
    iteration."""
    diff, norm = {}, {}
    for name, p in model.named_parameters():
        part = name.split('.', 1)[0]
        start = before[name].double()
        diff[part] = diff.get(part, 0.0) + float(
            (p.detach().double() - start).pow(2).sum())
        norm[part] = norm.get(part, 0.0) + float(start.pow(2).sum())
    return {part: (diff[part] / norm[part]) ** 0.5 if norm[part] else 0.0
            for part in diff}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument('--metric', required=True,
                        help='metric key, e.g. coco/bbox_mAP or mIoU')
    parser.add_argument('--min-gain', type=non_negative_float, default=0.0,
                        help='required rise of the metric (default: any)')
    args = parser.parse_args(argv)
    cfg = load_config(args)
    # Validate only before and after training (not also inside the loop).
    cfg.train_cfg.val_begin = 2**31
    runner = build_runner(cfg)
    runner._init_model_weights()  # what train() does first; it is idempotent
    model = getattr(runner.model, 'module', runner.model)
    before = _weights(model)
    start = runner.val_loop.run()
    runner.train()
    end = runner.val_loop.run()
    if args.metric not in start or args.metric not in end:
        raise KeyError(f'metric {args.metric!r} not computed; got {sorted(end)}')
    gain = end[args.metric] - start[args.metric]
    summary = dict(config=args.config, metric=args.metric,
                   start=start[args.metric], end=end[args.metric], gain=gain,
                   # every metric of both evaluations (e.g. segm beside bbox)
                   start_metrics=_numbers(start), end_metrics=_numbers(end),
                   weight_change=weight_change(before, model),
                   # what the run was: iterations and epochs trained, the
                   # seed that applied, the device
                   iters=runner.iter, epochs=runner.epoch, seed=runner.seed,
                   device=str(next(model.parameters()).device))
    print('[learning] ' + json.dumps(summary))
    return 0 if gain >= args.min_gain and gain > 0 else 1


if __name__ == '__main__':
    sys.exit(main())

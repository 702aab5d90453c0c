"""Seconds per training iteration of a config, at a fixed input size.

    python tools/analysis/train_speed.py CONFIG [--input-size 1333x800]
        [--batch 2] [--iters 10] [--warmup 3] [--work-dir DIR]
        [--cfg-options k=v ...]

CONFIG is a file or a library config such as
``mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py`` (a peer measured the
same way). The config is trained with its own runner, model, optimizer
wrapper and data (``clustr_mm/engine/short_run.py``; validation and
checkpoints off) for ``--warmup`` + ``--iters`` iterations, with these
changes, all for speed alone:

* ``--input-size WxH``: every resize of the training pipeline (``Resize``,
  ``RandomResize``, ``RandomChoiceResize``) becomes a ``Resize`` to exactly
  W x H without keeping the aspect ratio, so every image has that size
  whatever the dataset (the embedded COCO images too: synthetic-size
  inputs); a random choice of transforms with a resize among them (the
  multi-scale and crop augmentation of the ``ms-1x`` configs) becomes that
  one ``Resize`` too, since its crops would change the size again;
* ``--batch``: images per iteration;
* the backbone's ``init_cfg`` is dropped: random weights, no checkpoint or
  download needed.

An iteration is timed from ``before_train_iter`` to ``after_train_iter``
(forward, losses, backward, optimizer step; data loading excluded), with
``torch.cuda.synchronize()`` at both ends on a GPU. Reported: the median
and every timed iteration, the image size the model received (H, W of the
first image, before batch padding) and the batch, and the peak memory
(GPU: the largest ``torch.cuda.max_memory_allocated`` read at the end of
each timed iteration, since MMEngine's log processor resets the peak
statistics whenever it logs; CPU: the process's peak RSS). Prints one
``[train-speed] {json}`` line, also written to ``--out``.
"""
import argparse
import json
import os.path as osp
import resource
import shlex
import statistics
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402

import clustr_mm  # noqa: E402,F401
from clustr_mm.engine.cli_args import (  # noqa: E402
    non_negative_int, positive_int)
from clustr_mm.engine.short_run import run_short  # noqa: E402

RESIZES = ('Resize', 'RandomResize', 'RandomChoiceResize')
# transforms that pick among or wrap others (mmcv.transforms.wrappers)
CHOICES = ('RandomChoice', 'RandomApply', 'Compose')


def has_resize(transform) -> bool:
    """Whether ``transform`` (a dict, or a list of them) is or contains a
    resize of :data:`RESIZES`."""
    if isinstance(transform, (list, tuple)):
        return any(has_resize(t) for t in transform)
    if not isinstance(transform, dict):
        return False
    return (transform.get('type') in RESIZES
            or has_resize(transform.get('transforms')))


def load(config: str) -> Config:
    """A config file, or ``scope::path`` from an installed library's
    configs folder; what is missing (the library, the file) is named."""
    if '::' in config:
        from importlib.util import find_spec
        scope, _, rel = config.partition('::')
        spec = find_spec(scope) if scope.isidentifier() else None
        if spec is None or spec.origin is None:
            raise SystemExit(f'{config}: no installed library {scope!r} '
                             '(scope::path names a config of mmpretrain, '
                             'mmdet, mmseg or mmpose)')
        root = osp.join(osp.dirname(spec.origin), '.mim', 'configs')
        path = osp.join(root, rel)
        if not osp.isfile(path):
            raise SystemExit(
                f'{config}: {scope} has no config {rel!r} (looked in {root}; '
                'e.g. mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py)')
        config = path
    if not osp.isfile(config):
        raise SystemExit(f'config file not found: {config}')
    return Config.fromfile(config)


def fix_input_size(dataset, size) -> int:
    """Replace the resizes of every pipeline under ``dataset`` (dataset
    wrappers included), and the random choices among transforms that hold
    one, by a Resize to ``size`` = (W, H); returns how many."""
    done = 0
    if isinstance(dataset, (list, tuple)):
        return sum(fix_input_size(d, size) for d in dataset)
    if not isinstance(dataset, dict):
        return 0
    pipeline = dataset.get('pipeline')
    if isinstance(pipeline, list):
        for i, t in enumerate(pipeline):
            if (isinstance(t, dict) and t.get('type') in RESIZES + CHOICES
                    and has_resize(t)):
                pipeline[i] = dict(type='Resize', scale=tuple(size),
                                   keep_ratio=False)
                done += 1
    for key in ('dataset', 'datasets'):
        done += fix_input_size(dataset.get(key), size)
    return done


class StepTimer(Hook):
    """Times each training iteration; memory over the timed ones."""

    priority = 'VERY_HIGH'

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.times, self.image_shape, self.batch = [], None, None
        self.cuda = torch.cuda.is_available()
        self.cuda_peak = 0

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self.cuda and runner.iter == self.warmup:
            torch.cuda.reset_peak_memory_stats()
        inputs = (data_batch or {}).get('inputs')
        if inputs is not None and len(inputs):
            self.batch = len(inputs)
            self.image_shape = list(inputs[0].shape[-2:])
        self._sync()
        self.start = time.perf_counter()

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        self._sync()
        self.times.append(time.perf_counter() - self.start)
        # read before the LoggerHook (lower priority) can reset the peak
        if self.cuda and runner.iter >= self.warmup:
            self.cuda_peak = max(self.cuda_peak,
                                 torch.cuda.max_memory_allocated())

    def peak_mb(self) -> float:
        if self.cuda:
            return self.cuda_peak / 2**20
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def parse_size(text: str):
    try:
        w, h = (int(v) for v in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'--input-size takes WxH, e.g. 1333x800; got {text!r}')
    if w < 1 or h < 1:
        raise argparse.ArgumentTypeError(f'--input-size {text}: not positive')
    return w, h


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='config file or scope::path')
    parser.add_argument('--input-size', type=parse_size, metavar='WxH',
                        help='resize every training image to exactly W x H')
    parser.add_argument('--batch', type=positive_int,
                        help='images per iteration')
    parser.add_argument('--iters', type=positive_int, default=10,
                        help='timed iterations (default 10)')
    parser.add_argument('--warmup', type=non_negative_int, default=3,
                        help='untimed iterations first (default 3)')
    parser.add_argument('--work-dir', help='logs (default: a temporary dir)')
    parser.add_argument('--out', help='also write the JSON result here')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        default={}, help='override config entries')
    args = parser.parse_args(argv)

    cfg = load(args.config)
    cfg.merge_from_dict(args.cfg_options)
    cfg.launcher = 'none'
    cfg.model.backbone.init_cfg = None
    loader = cfg.train_dataloader
    if args.batch is not None:
        loader.batch_size = args.batch
    if args.input_size and not fix_input_size(loader.dataset,
                                              args.input_size):
        raise SystemExit(f'{args.config}: no {"/".join(RESIZES)} in the '
                         'training pipeline, so --input-size cannot be set')

    timer = StepTimer(args.warmup)
    run_short(cfg, args.warmup + args.iters, [timer], work_dir=args.work_dir)
    timed = timer.times[args.warmup:]
    device = (torch.cuda.get_device_name() if timer.cuda else 'cpu')
    result = dict(
        config=args.config, device=device, torch=torch.__version__,
        threads=torch.get_num_threads(), batch=timer.batch,
        image_shape=timer.image_shape, warmup=args.warmup,
        iters=len(timed), s_per_iter=statistics.median(timed),
        s_per_iter_all=[round(t, 4) for t in timed],
        peak_mem_mb=round(timer.peak_mb(), 1),
        peak_mem_kind='cuda max_memory_allocated' if timer.cuda else
        'process peak RSS',
        command=shlex.join(['python', *sys.argv]))
    line = json.dumps(result)
    print('[train-speed] ' + line, flush=True)
    if args.out:
        with open(args.out, 'w') as f:
            f.write(line + '\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())

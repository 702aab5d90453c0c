"""Seconds per training iteration of configs, and the hours that makes
their official schedule.

    python tools/analysis/train_speed.py [CONFIG ...] [--release [RECIPE ...]]
        [--amp] [--input-size 1333x800] [--batch 2] [--repeat N]
        [--iters 10] [--warmup 3] [--work-dir DIR] [--out FILE]
        [--cfg-options k=v ...]

CONFIG is a file or a library config such as
``mmdet::swin/mask-rcnn_swin-t-p4-w7_fpn_1x_coco.py`` (a peer measured the
same way); several are measured one after the other in this process
(``--release``: every config that reproduces a release, or those of the
named recipes). Each
is trained with its own runner, model, optimizer wrapper and data
(``clustr_mm/engine/short_run.py``; validation and checkpoints off) for
``--warmup`` + ``--iters`` iterations, with these changes, all for speed
alone:

* ``--input-size WxH``: every resize of the training pipeline (``Resize``,
  ``RandomResize``, ``RandomChoiceResize``) becomes a ``Resize`` to exactly
  W x H without keeping the aspect ratio, so every image has that size
  whatever the dataset (the embedded COCO images too: synthetic-size
  inputs); a random choice of transforms with a resize among them (the
  multi-scale and crop augmentation of the ``ms-1x`` configs) becomes that
  one ``Resize`` too, since its crops would change the size again;
* ``--batch``: images per iteration (default: the config's, which for a
  config that reproduces a release is the recipe's per GPU);
* ``--repeat N``: the training set is read N times an epoch
  (``RepeatDataset``), so a small one (the embedded data) fills batches of
  the recipe's size; a timed batch smaller than asked is an error;
* ``--amp``: mixed precision as ``tools/train.py --amp`` sets it (on a GPU
  fp16 with dynamic loss scaling, as every official launcher trains);
* the backbone's ``init_cfg`` is dropped: random weights, no checkpoint or
  download needed.

An iteration is timed from ``before_train_iter`` to ``after_train_iter``
(forward, losses, backward, optimizer step; data loading excluded), with
``torch.cuda.synchronize()`` at both ends on a GPU. Reported: the median
and every timed iteration, the image size the model received (H, W of the
first image, before batch padding) and the batch, and the peak memory
(GPU: the largest ``torch.cuda.max_memory_allocated`` read at the end of
each timed iteration, since MMEngine's log processor resets the peak
statistics whenever it logs; CPU: the process's peak RSS, so with several
configs the largest yet). For a config
that reproduces a release (``configs/official_recipes.yml``) also the
schedule's iterations and the hours they take on the recipe's number of
these devices at the median time (``expected_hours``: given only when
measured as the recipe trains, its batch per GPU and precision; data
loading and the GPUs' gradient exchange are not in it, so it is a lower
bound). Prints one ``[train-speed] {json}`` line per config as it finishes
(appended to ``--out`` as JSON lines), then a table of them all. Exits 1
if a config failed (the others are still measured).
"""
import argparse
import functools
import gc
import json
import os
import os.path as osp
import resource
import shlex
import statistics
import sys
import time
import traceback
from typing import Optional

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

import torch  # noqa: E402
import yaml  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402

import clustr_mm  # noqa: E402,F401
from clustr_mm.engine.options import merge_cfg_options  # noqa: E402
from clustr_mm.engine.cli_args import (  # noqa: E402
    new_file, non_negative_int, positive_int, work_dir)
from clustr_mm.engine.amp import AMP_WRAPPERS, use_amp  # noqa: E402
from clustr_mm.engine.short_run import run_short  # noqa: E402
from provenance import software  # noqa: E402

RECIPES = osp.join(ROOT, 'configs', 'official_recipes.yml')

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

    def __init__(self, warmup: int, batch: Optional[int] = None):
        self.warmup, self.batch = warmup, batch
        self.times, self.image_shape = [], None
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
            if self.batch is not None and len(inputs) != self.batch:
                raise RuntimeError(
                    f'iteration {runner.iter}: {len(inputs)} images, not the '
                    f'batch of {self.batch}: the training set (or what is '
                    'left of its epoch) is smaller than a batch; read it '
                    'several times an epoch with --repeat N')
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


def recipe_for(config: str) -> Optional[str]:
    """The name of the official recipe ``config`` reproduces, or None (not
    listed in configs/official_recipes.yml, or a library config)."""
    if '::' in config:
        return None
    entry = read_recipes()['configs'].get(
        osp.relpath(osp.abspath(config), ROOT))
    return None if entry is None else entry['recipe']


@functools.lru_cache(maxsize=1)
def read_recipes() -> dict:
    """configs/official_recipes.yml, parsed once (read only)."""
    with open(RECIPES) as f:
        return yaml.safe_load(f)


def schedule_iterations(recipe: dict) -> int:
    """Training iterations of an official schedule at its total batch."""
    if 'iterations' in recipe:
        return recipe['iterations']
    per_epoch = recipe.get('iterations_per_epoch')
    if per_epoch is None:  # timm and DeiT drop the last partial batch
        per_epoch = recipe['train_images'] // (
            recipe['gpus'] * recipe['batch_per_gpu'])
    return recipe['epochs'] * per_epoch


def release_estimate(result: dict, name: Optional[str], amp: bool) -> dict:
    """Recipe ``name``'s schedule at the measured median: iterations and
    hours on its GPUs, the hours only where measured as it trains."""
    if name is None:
        return dict(recipe=None)
    recipe = read_recipes()['recipes'][name]
    iterations = schedule_iterations(recipe)
    differ = []
    if result['batch'] != recipe['batch_per_gpu']:
        differ.append(f"batch {result['batch']}, the recipe's is "
                      f"{recipe['batch_per_gpu']} per GPU")
    if amp != (recipe['precision'] == 'amp'):
        differ.append('precision: the recipe trains with '
                      f"{recipe['precision']}, this run "
                      f"{'with' if amp else 'without'} --amp")
    return dict(
        recipe=name, recipe_gpus=recipe['gpus'],
        recipe_iterations=iterations,
        expected_hours=None if differ else round(
            iterations * result['s_per_iter'] / 3600, 2),
        expected_hours_not_given='; '.join(differ) or None)


def prepare(config: str, args) -> Config:
    """``config`` with the command line's changes; what cannot be changed
    is refused here, before any config trains."""
    cfg = load(config)
    merge_cfg_options(cfg, args.cfg_options, config)
    cfg.launcher = 'none'
    cfg.model.backbone.init_cfg = None
    loader = cfg.train_dataloader
    if args.input_size and not fix_input_size(loader.dataset,
                                              args.input_size):
        raise SystemExit(f'{config}: no {"/".join(RESIZES)} in the '
                         'training pipeline, so --input-size cannot be set')
    if args.amp:
        try:
            use_amp(cfg)
        except ValueError as error:
            raise SystemExit(f'{config}: {error}') from None
    if args.batch is not None:
        loader.batch_size = args.batch
    if args.repeat > 1:
        loader.dataset = dict(type='RepeatDataset', times=args.repeat,
                              dataset=loader.dataset)
    return cfg


def measure(config: str, cfg: Config, args) -> dict:
    """Train ``cfg`` (from :func:`prepare`) for the asked iterations; the
    result row."""
    amp = cfg.optim_wrapper.get('type') in AMP_WRAPPERS
    loader = cfg.train_dataloader
    timer = StepTimer(args.warmup, loader.batch_size)
    run_short(cfg, args.warmup + args.iters, [timer], work_dir=args.work_dir)
    timed = timer.times[args.warmup:]
    result = dict(
        config=config, device=(torch.cuda.get_device_name()
                               if timer.cuda else 'cpu'),
        torch=torch.__version__,
        **software('cuda' if timer.cuda else 'cpu'),
        threads=torch.get_num_threads(), amp=amp, batch=loader.batch_size,
        image_shape=timer.image_shape,
        warmup=args.warmup, iters=len(timed),
        s_per_iter=statistics.median(timed),
        s_per_iter_all=[round(t, 4) for t in timed],
        peak_mem_mb=round(timer.peak_mb(), 1),
        peak_mem_kind='cuda max_memory_allocated' if timer.cuda else
        'process peak RSS',
        command=shlex.join(['python', *sys.argv]))
    result.update(release_estimate(result, recipe_for(config), amp))
    return result


def table(rows: list) -> str:
    """The rows as a markdown table (the hours where given)."""
    lines = ['| config | device | amp | batch | image | s/iter | peak MB | '
             'schedule iterations | expected hours |',
             '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        hours, its = r.get('expected_hours'), r.get('recipe_iterations')
        if r.get('recipe_gpus'):
            hours = (f"{hours:,.1f} ({r['recipe_gpus']} x {r['device']})"
                     if hours is not None
                     else f"- ({r['expected_hours_not_given']})")
        lines.append(
            f"| {osp.basename(r['config'])} | {r['device']} | "
            f"{'yes' if r['amp'] else 'no'} | {r['batch']} | "
            f"{'x'.join(map(str, r['image_shape'] or []))} | "
            f"{r['s_per_iter']:.4f} | {r['peak_mem_mb']:,.0f} | "
            f"{f'{its:,}' if its else '-'} | {hours or '-'} |")
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('configs', nargs='*', metavar='CONFIG',
                        help='config files or scope::path')
    parser.add_argument('--release', nargs='*', metavar='RECIPE',
                        help='also every config that reproduces a release '
                        '(of these recipes of configs/official_recipes.yml; '
                        'none named: of all), in that file\'s order')
    parser.add_argument('--amp', action='store_true',
                        help='mixed precision, as tools/train.py --amp')
    parser.add_argument('--input-size', type=parse_size, metavar='WxH',
                        help='resize every training image to exactly W x H')
    parser.add_argument('--batch', type=positive_int,
                        help="images per iteration (default: the config's)")
    parser.add_argument('--repeat', type=positive_int, default=1,
                        help='read the training set N times an epoch')
    parser.add_argument('--iters', type=positive_int, default=10,
                        help='timed iterations (default 10)')
    parser.add_argument('--warmup', type=non_negative_int, default=3,
                        help='untimed iterations first (default 3)')
    parser.add_argument('--work-dir', type=work_dir,
                        help='logs (default: a temporary dir)')
    parser.add_argument('--out', type=new_file,
                        help='also write the JSON rows here')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        default={}, help='override config entries')
    args = parser.parse_args(argv)
    if args.release is not None:
        recipes = read_recipes()
        unknown = set(args.release) - set(recipes['recipes'])
        if unknown:
            parser.error(f'--release: no recipe {", ".join(sorted(unknown))}'
                         f' (recipes: {", ".join(recipes["recipes"])})')
        args.configs += [
            c for c, entry in recipes['configs'].items()
            if c not in args.configs
            and entry['recipe'] in (args.release or recipes['recipes'])]
    if not args.configs:
        parser.error('name a CONFIG, or --release')

    # every config is read before any is trained: a typo fails at once
    cfgs = [prepare(config, args) for config in args.configs]
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        open(args.out, 'w').close()
    rows, failed = [], []
    for config, cfg in zip(args.configs, cfgs):
        try:
            result = measure(config, cfg, args)
        except Exception:  # the next config is still measured
            traceback.print_exc()
            print(f'[train-speed] FAILED {config}', flush=True)
            failed.append(config)
            continue
        finally:
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows.append(result)
        line = json.dumps(result)
        print('[train-speed] ' + line, flush=True)
        if args.out:
            with open(args.out, 'a') as f:
                f.write(line + '\n')
    if rows:
        print(table(rows), flush=True)
    if failed:
        print(f'[train-speed] {len(failed)} of {len(args.configs)} configs '
              f'failed: {" ".join(failed)}', flush=True)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())

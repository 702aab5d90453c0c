"""Train a config for N iterations and report whether host memory grows.

    python tools/analysis/memory_soak.py CONFIG [--iters 300] [--warmup 20]
        [--window 10] [--max-growth-mb MB] [--work-dir DIR]
        [--cfg-options k=v ...]

The run uses the config's own model, data pipeline, optimizer and schedulers
(see ``clustr_mm/engine/short_run.py``; validation and checkpoints off). The
resident set size (RSS) of the process is read after every iteration.
Reported, in MiB:

* ``start``: median RSS of iterations ``warmup+1 .. warmup+window`` (the
  allocator and caches have settled by then),
* ``end``: median RSS of the last ``window`` iterations,
* ``growth`` = end - start, ``peak``, and ``slope``: the least-squares
  slope of RSS over all iterations after the warm-up, in KiB per iteration.

Medians over a window keep one iteration's transient allocations out of the
two end points. glibc's malloc raises its mmap threshold as large blocks are
freed and then keeps freed tensor buffers in the heap, which made single
iterations swing by up to 34 MiB (2026-11-26, 2-core CPU, four runs side by
side) and once moved the median by 12 MiB. The tool therefore fixes the
threshold (``--mmap-threshold-kib``, default 128, glibc's initial value; 0
leaves malloc's dynamic threshold alone): buffers above it are returned when
freed, and the RSS follows live memory within about 2 MiB. Other C libraries
are left as they are; the JSON line says which threshold applied.

Prints one ``[memory-soak] {json}`` line; with ``--max-growth-mb`` exits 1
when the growth exceeds it. Data loader worker processes (``num_workers`` >
0) are not counted: the embedded configs load in the main process.
"""
import argparse
import ctypes
import json
import os
import os.path as osp
import statistics
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from mmengine.hooks import Hook  # noqa: E402

import clustr_mm  # noqa: E402,F401
from clustr_mm.engine.cli_args import (  # noqa: E402
    non_negative_int, positive_float, positive_int)
from clustr_mm.engine.launch import add_common_args, load_config  # noqa: E402
from clustr_mm.engine.short_run import run_short  # noqa: E402

MIB = 1024 * 1024
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def fix_mmap_threshold(kib: int):
    """Fix glibc's mmap threshold at ``kib`` KiB; return it, or None where
    the C library has no ``mallopt`` or refuses (then RSS is as noisy as
    the allocator makes it)."""
    if kib <= 0:
        return None
    try:
        libc = ctypes.CDLL(None)
        return kib if libc.mallopt(M_MMAP_THRESHOLD, kib * 1024) == 1 \
            else None
    except (OSError, AttributeError):
        return None


def rss_bytes() -> int:
    """Current resident set size of this process."""
    try:
        with open('/proc/self/statm') as f:
            return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    except OSError:
        import psutil
        return psutil.Process().memory_info().rss


class RSSHook(Hook):
    """Record the RSS after every training iteration."""

    priority = 'LOWEST'

    def __init__(self):
        self.rss = []

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None) -> None:
        self.rss.append(rss_bytes())


def summarize(rss, warmup: int, window: int) -> dict:
    """Start / end / growth / peak (MiB) and slope (KiB/iter) of ``rss``."""
    if len(rss) < warmup + 2 * window:
        raise ValueError(f'{len(rss)} iterations are too few for a warm-up '
                         f'of {warmup} and windows of {window}')
    after = rss[warmup:]
    start = statistics.median(after[:window]) / MIB
    end = statistics.median(after[-window:]) / MIB
    xs = range(len(after))
    mx, my = statistics.fmean(xs), statistics.fmean(after)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, after)) /
             sum((x - mx)**2 for x in xs))
    return dict(start_mib=round(start, 1), end_mib=round(end, 1),
                growth_mib=round(end - start, 1),
                peak_mib=round(max(rss) / MIB, 1),
                first_iter_mib=round(rss[0] / MIB, 1),
                slope_kib_per_iter=round(slope / 1024, 2))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument('--iters', type=positive_int, default=300)
    parser.add_argument('--warmup', type=non_negative_int, default=20,
                        help='iterations before the start measurement')
    parser.add_argument('--window', type=positive_int, default=10,
                        help='iterations whose median RSS is an end point')
    parser.add_argument('--max-growth-mb', type=positive_float, default=None,
                        help='exit 1 if RSS grows by more (MiB)')
    parser.add_argument('--mmap-threshold-kib', type=non_negative_int,
                        default=128,
                        help="fix glibc's mmap threshold (0: leave it "
                        'dynamic); see the module docstring')
    args = parser.parse_args(argv)
    if args.iters < args.warmup + 2 * args.window:
        parser.error(f'--iters {args.iters} is too few for --warmup '
                     f'{args.warmup} and two --window of {args.window}: '
                     f'at least {args.warmup + 2 * args.window}')
    threshold = fix_mmap_threshold(args.mmap_threshold_kib)
    cfg = load_config(args)
    hook = RSSHook()
    begin = time.time()
    run_short(cfg, args.iters, [hook], work_dir=args.work_dir)
    summary = dict(config=args.config, iters=len(hook.rss),
                   warmup=args.warmup, window=args.window,
                   mmap_threshold_kib=threshold,
                   **summarize(hook.rss, args.warmup, args.window),
                   seconds=round(time.time() - begin, 1))
    ok = (args.max_growth_mb is None
          or summary['growth_mib'] <= args.max_growth_mb)
    summary['ok'] = ok
    print('[memory-soak] ' + json.dumps(summary), flush=True)
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())

"""Backbone speed and memory with peers: CPU latency and GPU img/s.

CPU latency (the default; batch 1, 2 threads):

    python tools/analysis/benchmark.py --models clustr-s-exact clustr-s-window \
        paca-s pvtv2-b2 swin-t resnet50 --sizes 224 512 800x1344 \
        [--batch 1] [--threads 2] [--runs 5] [--warmup 1] [--flops] \
        [--breakdown] [--profile] [--out results.json] [--plot plot.png] \
        [--max-size clustr-s-exact=640]

GPU throughput, inference and training step (img/s and peak memory):

    python tools/analysis/benchmark.py --device cuda --amp bf16 --batch 128 \
        --sizes 224 --train-step --models clustr-s-exact clustr-s-window \
        paca-s pvtv2-b2 swin-t
    python tools/analysis/benchmark.py --device cuda --amp bf16 --batch 2 \
        --sizes 800x1344 --train-step --models clustr-s-window paca-s \
        pvtv2-b2 swin-t

The other jobs have their own tools beside this one (``op_census.py``,
``traffic_census.py``, ``onnxruntime_speed.py``, ``plot_benchmark.py``);
what they share (models, child processes, rows) is ``benchmark_common.py``.

- Timing: the median of ``--runs`` calls after ``--warmup`` (default 1 on the
  CPU, 2 on a GPU); on a GPU the clock starts and stops after
  ``torch.cuda.synchronize()``. img/s is ``--batch`` / median seconds.
- Peak memory, for the forwards and separately for the training steps: on
  the CPU the kernel's peak RSS during the phase minus the RSS before it
  (above the built model); on a GPU ``torch.cuda.max_memory_allocated()``
  after ``reset_peak_memory_stats()`` (weights, input and, for training,
  gradients and optimizer state included).
- ``--train-step``: forward, loss (sum of the means of the output maps),
  backward and an AdamW step (lr 1e-4, weight decay 0.05, as the configs).
- ``--amp bf16|fp16``: ``torch.autocast`` around each forward and its loss;
  fp16 training scales the loss with a GradScaler. fp16 is GPU-only.
- With ``--device cuda``, ``--amp`` or ``--train-step`` the table gives img/s
  and peak memory for inference and training, then each model's img/s
  relative to ``pvtv2-b2`` at the same size; otherwise latency in seconds.
- ``--compile MODE``: time ``torch.compile(model, mode=MODE,
  fullgraph=True, dynamic=False)`` (``reduce-overhead`` records CUDA graphs
  on a GPU); the warm-up (default 3 then) takes the compilation, the JSON
  gives ``compiled_graphs`` (1 per model and train/eval mode when nothing
  breaks the graph).
- ``--precision ieee|tf32x3``: the distance products of ClusTR's fused
  clustering (the reducers' ``precision``; default tf32x3, the model's).
  Each row's ``precision`` is what applied: the asked one where the fused
  op computes (CUDA with Triton), ``ieee`` where ClusTR clusters with the
  IEEE fp32 backends (a CPU), None for a model without the clustering.

The output starts with the device, torch version, batch, amp and command
line; every row of the ``--out`` JSON carries them too. ``--max-size MODEL=S``
skips a model's inputs larger than S x S pixels (exact ClusTR is quadratic
in the tokens); ``--plot`` draws latency and peak memory against the input
side with log-log scaling exponents (``plot_benchmark.py``, which also
replots a saved JSON).
"""
import os.path as osp
import statistics
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from benchmark_common import (Table, autocast, parse_common,  # noqa: E402
                              parser_for, prepare, run, run_info,
                              synchronizer, time_forward, timed_phase)
from forward_profile import BlockTimer, profile_top, stage_lines  # noqa: E402

from clustr_mm.engine.cli_args import new_file  # noqa: E402

REFERENCE = 'pvtv2-b2'  # img/s ratios are given against this model
# options of this tool before each job had its own
MOVED = {'--census': 'op_census.py', '--traffic': 'traffic_census.py',
         '--scale-batch': 'traffic_census.py',
         '--runtime': 'onnxruntime_speed.py'}


def fmt(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) else '-'


def grad_scaler():
    """fp16 loss scaling; ``torch.amp.GradScaler`` is torch >= 2.3."""
    if hasattr(torch.amp, 'GradScaler'):
        return torch.amp.GradScaler('cuda')
    return torch.cuda.amp.GradScaler()


def compiled_graphs():
    """Graphs dynamo compiled in this process (one per model and mode with
    fullgraph=True); None where torch keeps no such counter."""
    try:
        from torch._dynamo.utils import counters
        return int(counters['stats']['unique_graphs'])
    except (ImportError, KeyError, TypeError):
        return None


def time_train_step(model, x, args, sync):
    """The training step's row fields (forward, loss, backward, AdamW)."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    scaler = grad_scaler() if args.amp == 'fp16' else None

    def train_step():
        with autocast(args):
            loss = sum(o.float().mean() for o in model(x))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)

    times, peak = timed_phase(train_step, args, sync)
    runs = times[args.warmup:]
    step = statistics.median(runs)
    return dict(train_step_s=step, train_runs_s=runs, peak_train_mem_mb=peak,
                train_img_s=args.batch / step)


def measure(name, size, args):
    """One (model, size) measurement; runs inside the child process."""
    model, x, result = prepare(name, size, args)
    if args.compile != 'none':
        torch._dynamo.reset()
        model = torch.compile(
            model, mode=None if args.compile == 'default' else args.compile,
            fullgraph=True, dynamic=False)

    def forward():
        with autocast(args):
            return model(x)

    sync = synchronizer(args.device)
    result.update(time_forward(forward, args, sync))
    if args.breakdown:
        timer = BlockTimer(model, sync)
        with torch.no_grad():
            sync()
            t0 = time.perf_counter()
            forward()
            sync()
            total = time.perf_counter() - t0
        result['breakdown_s'] = dict(timer.totals, total=total)
    if args.profile:
        result['profile'] = profile_top(forward, sync, args.device,
                                        model=model)
    if args.flops:
        from clustr_mm.analysis.flops import analyze_flops
        by_op = analyze_flops(model, x).by_operator
        result['gflops'] = sum(by_op.values()) / 1e9
        result['gflops_by_op'] = {k: v / 1e9 for k, v in by_op.most_common()}
        result['gflops_per_s'] = result['gflops'] / result['latency_s']
    if args.train_step:
        result.update(time_train_step(model, x, args, sync))
    if args.compile != 'none':
        result['compiled_graphs'] = compiled_graphs()
    return result


class SpeedTable(Table):
    """Latency (CPU, fp32 eval) or img/s and peak memory (GPU, AMP or
    training step), then img/s ratios to ``REFERENCE``."""

    def __init__(self, args):
        super().__init__(args)
        self.throughput = bool(args.device == 'cuda' or args.amp != 'none'
                               or args.train_step)

    def header(self):
        if self.throughput:
            head = (f'{"model":16s} {"size":>9s} {"batch":>5s} '
                    f'{"params(M)":>9s} {"infer img/s":>11s} '
                    f'{"infer peak(MB)":>14s} {"train img/s":>11s} '
                    f'{"train peak(MB)":>14s}')
        else:
            head = (f'{"model":16s} {"size":>9s} {"params(M)":>9s} '
                    f'{"latency(s)":>10s} {"peak(MB)":>9s}')
        if self.args.flops:
            head += f' {"GFLOPs":>7s} {"GFLOP/s":>8s}'
        return head

    def cells(self, r):
        if self.throughput:
            line = (f'{r["batch"]:5d} {r["params_m"]:9.2f} '
                    f'{r["infer_img_s"]:11.1f} '
                    f'{r["peak_forward_mem_mb"]:14.0f} '
                    f'{fmt(r.get("train_img_s"), "11.1f"):>11s} '
                    f'{fmt(r.get("peak_train_mem_mb"), "14.0f"):>14s}')
        else:
            line = (f'{r["params_m"]:9.2f} {r["latency_s"]:10.3f} '
                    f'{r["peak_forward_mem_mb"]:9.0f}')
        if self.args.flops:
            line += (f' {r["gflops"]:7.1f} {r["gflops_per_s"]:8.1f}')
        if 'profile' in r:
            p = r['profile']
            line += (f'\n    profile: {p["total_ms"]:.1f} ms of self time '
                     'in one forward; the most:')
            line += ''.join(f'\n      {e["ms"]:9.2f} ms {e["calls"]:5d}x  '
                            f'{e["name"]}' for e in p['top'])
            line += stage_lines(p.get('ranges', {}))
        if 'breakdown_s' in r:
            line += '\n    ' + ', '.join(f'{k} {v:.3f}s'
                                         for k, v in r['breakdown_s'].items())
        return line

    def ratios(self, rows):
        """img/s of each row over the reference model's at the same size,
        added to the rows; the lines to print."""
        ref = next((r for r in rows if r['model'] == REFERENCE
                    and 'infer_img_s' in r), None)
        if not self.throughput or ref is None:
            return []
        lines = [f'  img/s relative to {REFERENCE} at {ref["size"]}:']
        for r in rows:
            if r is ref or 'infer_img_s' not in r:
                continue
            parts = []
            for phase in ('infer', 'train'):
                key = f'{phase}_img_s'
                if key in r and key in ref:
                    ratio = r[key] / ref[key]
                    r[f'{phase}_vs_{REFERENCE.replace("-", "_")}'] = ratio
                    parts.append(f'{phase} {ratio:.2f}x')
            lines.append(f'    {r["model"]:16s} ' + '  '.join(parts))
        return lines


def parse_args(argv):
    for option, tool in MOVED.items():
        if any(a == option or a.startswith(option + '=') for a in argv):
            sys.exit(f'benchmark.py: {option} is now its own tool: '
                     f'tools/analysis/{tool} (same arguments otherwise)')
    parser = parser_for(__doc__)
    parser.add_argument('--train-step', action='store_true',
                        help='also time forward + backward + AdamW step')
    parser.add_argument('--with-cp', action='store_true',
                        help='build every model with with_cp=True (gradient '
                        'checkpointing of each block; for --train-step)')
    parser.add_argument('--compile', default='none',
                        choices=('none', 'default', 'reduce-overhead',
                                 'max-autotune'),
                        help='torch.compile(fullgraph=True, dynamic=False) '
                        'with this mode (reduce-overhead: CUDA graphs)')
    parser.add_argument('--flops', action='store_true',
                        help='count FLOPs (attention and clustering included)')
    parser.add_argument('--breakdown', action='store_true',
                        help='time spent in clustering / attention / MLP')
    parser.add_argument('--profile', action='store_true',
                        help='also profile one eval forward (torch.profiler):'
                        ' the ops with the most self time (CUDA kernels on '
                        'a GPU)')
    parser.add_argument('--plot', metavar='PNG', type=new_file,
                        help='draw latency and memory versus input size here')
    args = parse_common(parser, argv)
    if args.compile != 'none':
        clash = [f for f in ('flops', 'breakdown', 'profile')
                 if getattr(args, f)]
        if clash:
            parser.error('--compile times the compiled model; ' +
                         ', '.join('--' + f for f in clash) +
                         ' need the eager one (run them without --compile)')
    return args


def main(argv=None):
    argv = sys.argv if argv is None else argv
    args = parse_args(argv[1:])
    results = run(osp.abspath(__file__), args, argv, measure,
                  SpeedTable(args), None if args.worker else run_info(args, argv))
    if args.plot and not args.worker:
        from plot_benchmark import plot
        plot(results, args.plot)
        print(f'wrote {args.plot}')


if __name__ == '__main__':
    main()

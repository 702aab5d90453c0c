"""What the benchmark tools share: the models they build, one child process
per (model, size), and the rows they print and write.

The tools, one per job (each one's docstring says how to run it):

- ``benchmark.py``: CPU latency and GPU throughput (inference and training
  step), peak memory, FLOPs, a time breakdown, a profile, ``torch.compile``;
- ``op_census.py``: aten ops and host syncs of one eval forward;
- ``host_time.py``: the host's Python and dispatch time of one forward
  (on ``meta``: no arithmetic), the share a GPU waits on at small batches;
- ``traffic_census.py``: bytes, FLOPs and a roofline time bound per op;
- ``onnxruntime_speed.py``: the exported backbone in ONNX Runtime against
  eager PyTorch;
- ``plot_benchmark.py``: draws what ``benchmark.py --out`` wrote.

Each (model, size) is measured in a fresh child process (the tool run again
with ``--worker MODEL SIZE``): no measurement is polluted by an earlier one.
Every ``--out`` row carries the run's facts (device, driver, torch, CUDA,
Triton: ``provenance.py``; batch, amp, command, ...) beside its own. Peers
come from the installed mmdet.
"""
import argparse
import contextlib
import ctypes
import json
import os
import os.path as osp
import re
import shlex
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))  # provenance.py

from clustr_mm.engine.cli_args import new_file, positive_int  # noqa: E402
from provenance import cpu_name, software  # noqa: E402

MODELS = {
    'clustr-t-exact': dict(type='ClusTR', arch='tiny', clustering_mode='exact'),
    'clustr-s-exact': dict(type='ClusTR', arch='small', clustering_mode='exact'),
    'clustr-b-exact': dict(type='ClusTR', arch='base', clustering_mode='exact'),
    'clustr-t-window': dict(type='ClusTR', arch='tiny', clustering_mode='window'),
    'clustr-s-window': dict(type='ClusTR', arch='small', clustering_mode='window'),
    'clustr-b-window': dict(type='ClusTR', arch='base', clustering_mode='window'),
    'paca-t': dict(type='PaCaViT', arch='tiny'),
    'paca-s': dict(type='PaCaViT', arch='small'),
    'paca-b': dict(type='PaCaViT', arch='base'),
    'pvtv2-b2': dict(type='mmdet.PyramidVisionTransformerV2', embed_dims=64,
                     num_layers=[3, 4, 6, 3]),
    'swin-t': dict(type='mmdet.SwinTransformer', embed_dims=96,
                   depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                   window_size=7, out_indices=(0, 1, 2, 3)),
    'resnet50': dict(type='mmdet.ResNet', depth=50),
}
DEFAULT_MODELS = ['clustr-s-exact', 'clustr-s-window', 'paca-s', 'pvtv2-b2',
                  'swin-t', 'resnet50']
AMP_DTYPES = {'bf16': 'bfloat16', 'fp16': 'float16'}


def parse_size(text):
    """'S' -> (S, S), 'HxW' -> (H, W); anything else is refused."""
    match = re.fullmatch(r'([1-9]\d*)(?:x([1-9]\d*))?', text)
    if match is None:
        raise ValueError(f'{text!r} is not a size: expected S or HxW with '
                         'positive integers, e.g. 224 or 800x1344')
    h, w = match.groups()
    return int(h), int(w or h)


def build(name, with_cp=False):
    import clustr_mm  # noqa: F401
    import mmdet.models  # noqa: F401  (registers the peers)
    from mmengine.registry import MODELS as ROOT
    from mmdet.registry import MODELS as DET
    cfg = dict(MODELS[name])
    if with_cp:  # every model here has the option (mmdet's peers too)
        cfg['with_cp'] = True
    registry = DET if cfg['type'].startswith('mmdet.') else ROOT
    cfg['type'] = cfg['type'].split('.')[-1]
    model = registry.build(cfg)
    # not `return model.eval()`: mmdet's Swin/ResNet train() returns None
    model.eval()
    return model


def set_precision(model, precision, device, counted):
    """The fused clustering's distance products in every DPC-kNN reducer;
    returns the precision that applies (a row's ``precision``): None
    without a reducer, ``precision`` where the fused op runs on ``device``
    or is ``counted`` (the traffic census), else 'ieee' (the blocked and
    reference backends are IEEE fp32 whatever is asked)."""
    from clustr_mm.models.layers.dpc_knn import DPCKNN
    from clustr_mm.ops.dpc_knn import Task, fused
    reducers = [m for m in model.modules() if isinstance(m, DPCKNN)]
    for m in reducers:
        m.precision = precision
    if not reducers:
        return None
    runs = counted or fused.why_not(Task(torch.device(device))) is None
    return precision if runs else 'ieee'


def cuda_path(model):
    """Make ClusTR's clustering take its CUDA path on any device: the fused
    op (on a CPU it runs the blocked code inside, seen as the one op)."""
    from clustr_mm.models.layers.dpc_knn import use_plan
    from clustr_mm.ops.dpc_knn import FUSED_PLAN
    use_plan(model, FUSED_PLAN)


def prepare(name, size, args, counted=False):
    """The model (built on ``args.device``), a random input batch and the
    row's first fields, as every tool's worker starts."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build(name, getattr(args, 'with_cp', False)).to(args.device)
    applied = set_precision(model, args.precision, args.device, counted)
    x = torch.randn(args.batch, 3, *size, device=args.device)
    row = dict(model=name, size=f'{size[0]}x{size[1]}', batch=args.batch,
               threads=args.threads, compile=getattr(args, 'compile', 'none'),
               with_cp=getattr(args, 'with_cp', False), precision=applied,
               params_m=sum(p.numel() for p in model.parameters()) / 1e6)
    return model, x, row


def autocast(args):
    """A fresh autocast context per call (weights are re-cast every call, as
    in a real loop), or none without ``--amp``."""
    if args.amp == 'none':
        return contextlib.nullcontext()
    return torch.autocast(args.device, dtype=getattr(torch,
                                                     AMP_DTYPES[args.amp]))


# -- timing and peak memory ---------------------------------------------------
def _status_mb(field):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f'{field} not in /proc/self/status')


class PeakMemory:
    """Peak memory (MB) of one phase of a measurement, per device."""

    def __init__(self, device):
        self.cuda = device == 'cuda'
        self.base = 0.0

    def start(self):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            # freed heap pages back to the kernel (glibc), so that memory an
            # earlier phase freed does not hide this phase's peak RSS; then
            # the kernel's peak-RSS counter (VmHWM) restarts from the RSS
            trim = getattr(ctypes.CDLL(None), 'malloc_trim', None)
            if trim is not None:
                trim(0)
            with open('/proc/self/clear_refs', 'w') as f:
                f.write('5')
            self.base = _status_mb('VmRSS')

    def read(self):
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        return _status_mb('VmHWM') - self.base


def synchronizer(device):
    """What makes the host wait for the device before reading the clock."""
    return torch.cuda.synchronize if device == 'cuda' else (lambda: None)


def timed_phase(step, args, sync):
    """Seconds of each of ``--warmup`` + ``--runs`` synchronised calls and the
    phase's peak memory."""
    memory = PeakMemory(args.device)
    memory.start()
    times = []
    for _ in range(args.warmup + args.runs):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    return times, memory.read()


def time_forward(forward, args, sync):
    """The eval forward's row fields: first call, median latency, the timed
    runs, peak memory and img/s."""
    with torch.no_grad():
        times, peak = timed_phase(forward, args, sync)
    runs = times[args.warmup:]
    latency = statistics.median(runs)
    return dict(first_forward_s=times[0], latency_s=latency,
                latency_runs_s=runs, peak_forward_mem_mb=peak,
                infer_img_s=args.batch / latency)


# -- the command line ---------------------------------------------------------
def parser_for(doc, *, device=True, amp=True, timed=True, precision=True):
    """The arguments every tool takes; ``device``/``amp``/``timed``
    (``--runs``, ``--warmup``)/``precision`` where the tool's job has them."""
    parser = argparse.ArgumentParser(
        description=doc.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--models', nargs='+', default=DEFAULT_MODELS,
                        choices=sorted(MODELS), metavar='MODEL',
                        help=f'any of: {", ".join(sorted(MODELS))}')
    parser.add_argument('--sizes', nargs='+', default=['224', '512'],
                        help='input sizes: S (square) or HxW')
    parser.add_argument('--batch', type=positive_int, default=1)
    parser.add_argument('--threads', type=int, default=2)
    if timed:
        parser.add_argument('--runs', type=positive_int, default=5,
                            help='timed calls; the median is reported')
        parser.add_argument('--warmup', type=int,
                            help='untimed calls first (default 1 on cpu, 2 '
                            'on cuda)')
    else:  # one untimed call, then the one measured
        parser.set_defaults(runs=1, warmup=None)
    if device:
        parser.add_argument('--device', choices=('cpu', 'cuda'),
                            default='cpu')
    else:
        parser.set_defaults(device='cpu')
    if amp:
        parser.add_argument('--amp', choices=('none', 'bf16', 'fp16'),
                            default='none',
                            help='autocast dtype for forward and loss')
    else:
        parser.set_defaults(amp='none')
    if precision:
        parser.add_argument('--precision', choices=('ieee', 'tf32x3'),
                            default='tf32x3',
                            help="the distance products of ClusTR's fused "
                            "clustering: tf32x3 (3xTF32 on tensor cores, "
                            "the model's default) or ieee (fp32 FMA "
                            "products)")
    else:  # ClusTR clusters with its IEEE fp32 backends on a CPU
        parser.set_defaults(precision='ieee')
    parser.add_argument('--timeout', type=positive_int, default=1800,
                        help='seconds per (model, size) child')
    parser.add_argument('--out', type=new_file,
                        help='write all results as JSON here')
    parser.add_argument('--max-size', nargs='+', default=[],
                        metavar='MODEL=S',
                        help='skip inputs above S x S pixels for MODEL')
    parser.add_argument('--worker', nargs=2, help=argparse.SUPPRESS)
    return parser


def parse_common(parser, argv):
    """Parse ``argv`` and check what every tool shares; ``args.argv`` keeps
    the arguments for the child processes, ``args.max_pixels`` the
    ``--max-size`` limits."""
    args = parser.parse_args(argv)
    args.argv = list(argv)
    if args.warmup is None:
        # compiling and CUDA-graph recording take the first calls
        args.warmup = (3 if getattr(args, 'compile', 'none') != 'none' else
                       2 if args.device == 'cuda' else 1)
    if args.warmup < 0:
        parser.error(f'--warmup must be >= 0, got {args.warmup}')
    if args.threads < 1:
        parser.error(f'--threads must be an int >= 1 (torch threads of each '
                     f'measurement), got {args.threads}')
    if args.amp == 'fp16' and args.device == 'cpu':
        parser.error('--amp fp16 needs --device cuda (fp16 training needs a '
                     'CUDA GradScaler); on the CPU use --amp bf16')
    if args.device == 'cuda' and not torch.cuda.is_available():
        parser.error(f'--device cuda, but torch {torch.__version__} sees no '
                     'CUDA device (torch.cuda.is_available() is False); use '
                     '--device cpu')
    for size in args.sizes:
        try:
            parse_size(size)
        except ValueError as err:
            parser.error(f'--sizes: {err}')
    args.max_pixels = {}
    for item in args.max_size:
        name, _, size = item.partition('=')
        if not name or not size:
            parser.error(f'--max-size takes MODEL=S, got {item!r}')
        if name not in MODELS:
            parser.error(f'--max-size {item}: unknown model {name!r}; the '
                         f'models are {", ".join(sorted(MODELS))}')
        try:
            h, w = parse_size(size)
        except ValueError as err:
            parser.error(f'--max-size {item}: {err}')
        args.max_pixels[name] = h * w
    return args


# -- the run: one child per (model, size), rows printed and written ----------
def run_child(tool, name, size, args):
    """The row of ``tool`` (a tool's file) run again as a worker for one
    (model, size); a failed or timed-out child is a row with an ``error``."""
    size_text = f'{size[0]}x{size[1]}'
    cmd = [sys.executable, tool, *args.argv, '--worker', name, size_text]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:  # the row says so; the others go on
        return dict(model=name, size=size_text, precision=None,
                    error=f'stopped after --timeout {args.timeout} s')
    for line in proc.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[7:])
    err = (proc.stderr or proc.stdout).strip().splitlines()
    return dict(model=name, size=size_text, precision=None,
                error=err[-1] if err else f'exit {proc.returncode}')


def run_info(args, argv, runtime='eager', calls=None):
    """What the numbers were measured on and with; heads output and JSON.
    ``calls``: (warm-up, runs) where the tool does not time ``--runs``."""
    warmup, runs = calls or (args.warmup, args.runs)
    return dict(device=args.device, device_name=(
                    torch.cuda.get_device_name() if args.device == 'cuda'
                    else cpu_name()),
                torch=torch.__version__, **software(args.device),
                amp=args.amp,
                compile=getattr(args, 'compile', 'none'),
                precision=args.precision, runtime=runtime, warmup=warmup,
                runs=runs, command=shlex.join(['python', *argv]))


class Table:
    """A tool's printed table. A tool's subclass gives ``header()`` and
    ``cells(row)`` of a measured row (skipped and failed rows are said
    here) and may give ``ratios(rows)`` to peers of the same run."""

    def __init__(self, args):
        self.args = args

    def row(self, r):
        start = f'{r["model"]:16s} {r["size"]:>9s}'
        if 'skipped' in r:
            return f'{start}  skipped ({r["skipped"]})'
        if 'error' in r:
            return f'{start}  failed: {r["error"]}'
        return f'{start} {self.cells(r)}'

    def ratios(self, rows):
        return []


def run(tool, args, argv, measure, table, info):
    """A tool's main: as a worker, measure one (model, size) and print its
    ``RESULT`` line; else measure every (model, size) in a child, print
    the table and ratios per size and write ``--out``; returns the rows."""
    if args.worker:
        result = measure(args.worker[0], parse_size(args.worker[1]), args)
        print('RESULT ' + json.dumps(result))
        return [result]
    extra = ''.join(f' | {k} {info[k]}' for k in ('onnxruntime', 'onnx')
                    if k in info)
    print(f'device: {info["device"]} ({info["device_name"]}) | torch '
          f'{info["torch"]} | batch {args.batch} | amp {info["amp"]} | '
          f'compile {info["compile"]} | with_cp '
          f'{getattr(args, "with_cp", False)} | warm-up {info["warmup"]}, '
          f'runs {info["runs"]} | threads {args.threads}{extra}')
    print(f'command: {info["command"]}')
    print(table.header(), flush=True)
    results = []
    for size in map(parse_size, args.sizes):
        rows = []
        for name in args.models:
            if size[0] * size[1] > args.max_pixels.get(name, float('inf')):
                r = dict(model=name, size=f'{size[0]}x{size[1]}',
                         skipped='above --max-size', precision=None)
            else:
                r = run_child(tool, name, size, args)
            # the run's facts, then the row's own (precision: what applied)
            r = {**info, **r}
            rows.append(r)
            print(table.row(r), flush=True)
        for line in table.ratios(rows):
            print(line)
        results += rows
    if args.out:
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            json.dump(results, f, indent=1)
        print(f'wrote {args.out}')
    return results

"""Backbone speed and memory with peers: CPU latency, GPU img/s, op census.

CPU latency (the default; batch 1, 2 threads):

    python tools/analysis/benchmark.py --models clustr-s-exact clustr-s-window \
        paca-s pvtv2-b2 swin-t resnet50 --sizes 224 512 800x1344 \
        [--batch 1] [--threads 2] [--runs 5] [--warmup 1] [--flops] \
        [--breakdown] [--out results.json] [--plot plot.png] \
        [--max-size clustr-s-exact=640]

GPU throughput, inference and training step (img/s and peak memory):

    python tools/analysis/benchmark.py --device cuda --amp bf16 --batch 128 \
        --sizes 224 --train-step --models clustr-s-exact clustr-s-window \
        paca-s pvtv2-b2 swin-t
    python tools/analysis/benchmark.py --device cuda --amp bf16 --batch 2 \
        --sizes 800x1344 --train-step --models clustr-s-window paca-s \
        pvtv2-b2 swin-t

Op census (aten ops and host syncs of one eval forward, on any device):

    python tools/analysis/benchmark.py --census --batch 2 --sizes 224 512 800x1344

Traffic census (bytes moved, FLOPs and a roofline time bound per op of one
eval forward, or with ``--train-step`` one forward + backward, on any
device; the GPU code path; ratios to the peers of the same run):

    python tools/analysis/benchmark.py --traffic --amp bf16 --batch 2 \
        --scale-batch 128 --sizes 224 --models clustr-s-window paca-s \
        pvtv2-b2 swin-t
    python tools/analysis/benchmark.py --traffic --amp bf16 --batch 2 \
        --train-step --sizes 800x1344 --models clustr-s-window paca-s \
        pvtv2-b2 swin-t

ONNX Runtime against eager PyTorch (CPU; both in the same child process):

    python tools/analysis/benchmark.py --runtime onnxruntime \
        --models clustr-s-exact clustr-s-window paca-s --sizes 224 512 \
        --batch 1 --threads 2 --runs 7

Every (model, size) is measured in a fresh child process, so no measurement
is polluted by an earlier one. Peers come from the installed mmdet.

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
- ``--traffic``: no timing; ``clustr_mm.analysis.traffic`` of one call
  after a warm-up one: per op the bytes read and written at the dtype it ran
  in, its FLOPs (``torch.utils.flop_counter``), and a roofline time bound
  ``max(bytes / 3.0 TB/s, FLOPs / peak, 2.5 us)`` with peak ~600 TFLOP/s for
  bf16/fp16 inputs and ~50 TFLOP/s for fp32 (an H100's, rounded); totals,
  the ten biggest ops, and each model's ratios to ``swin-t`` and
  ``pvtv2-b2`` when they ran. ``--scale-batch N`` reports batch N from a
  ``--batch`` run: ops on weights alone keep their traffic, all others are
  scaled by N / batch. ClusTR's fused clustering op counts as one op with
  its real inputs, outputs and FLOPs; with ``--precision tf32x3`` its FLOPs
  run at ~165 TFLOP/s (3xTF32: three products at the ~495 TFLOP/s dense
  TF32 peak per fp32 product).
- ``--precision ieee|tf32x3``: the distance products of ClusTR's fused
  clustering (the reducers' ``precision``; default tf32x3, the model's).
  Each row's ``precision`` is what applied: the asked one where the fused
  op computes (CUDA with Triton) or is counted (``--traffic``), ``ieee``
  where ClusTR clusters with the IEEE fp32 backends (a CPU), None for a
  model without the clustering.
- ``--runtime onnxruntime``: after the eager timing (as without it), the
  backbone is exported with ``tools/deployment/pytorch2onnx.py``'s
  ``export`` (TorchScript exporter, opset 17, static input shape: the
  timed (batch, 3, H, W); ClusTR's clustering in its export formulation) to
  a temporary file and run by its ``ort_session`` (CPU execution provider,
  ``intra_op_num_threads`` = ``--threads``, one inter-op thread, sequential
  execution, default graph optimisations), timed the same way (``--warmup``
  then ``--runs`` calls of ``session.run``, median, peak RSS of the phase).
  Per row: eager and ORT median ms, their ratio ORT / eager, the export's
  seconds, and the largest |ORT - eager| over the outputs of the timed
  input (a sanity check). CPU and fp32 eval only: ``--device cuda``,
  ``--amp``, ``--compile``, ``--train-step``, ``--with-cp``, ``--flops``,
  ``--breakdown``, ``--census``, ``--traffic`` and ``--plot`` are refused
  with it.
- ``--census``: no timing; ``clustr_mm.analysis.op_census`` of one eval
  forward after a warm-up one: the ops (about the kernel launches on a GPU),
  the host syncs and the most frequent ops. ClusTR's clustering runs its
  CUDA path (``FUSED_PLAN`` in ``dpc_knn``: the fused op) on every
  device, so a CPU census counts the GPU's code path.

The output starts with the device, torch version, batch, amp and command
line; every row of the ``--out`` JSON carries them too. ``--max-size MODEL=S``
skips a model's inputs larger than S x S pixels (exact ClusTR is quadratic
in the tokens); ``--plot`` draws latency and peak memory against the input
side with log-log scaling exponents (``tools/analysis/plot_benchmark.py``,
which also replots a saved JSON).
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
import tempfile
import time

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

from clustr_mm.engine.cli_args import positive_int  # noqa: E402

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
# Which part of a block a module's time belongs to, by the module's name.
CATEGORIES = (('clustering', ('cluster', 'clustering')), ('attention', ('attn', )),
              ('mlp', ('mlp', 'ffn')))


AMP_DTYPES = {'bf16': 'bfloat16', 'fp16': 'float16'}
REFERENCE = 'pvtv2-b2'  # img/s ratios are given against this model
TRAFFIC_PEERS = ('swin-t', 'pvtv2-b2')  # traffic ratios against these


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


def _status_mb(field):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(field + ':'):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f'{field} not in /proc/self/status')


def reset_peak_rss():
    """Restart the kernel's peak-RSS counter (VmHWM) from the current RSS."""
    with open('/proc/self/clear_refs', 'w') as f:
        f.write('5')


def release_free_heap():
    """Return freed heap pages to the kernel (glibc), so that memory an
    earlier phase freed does not hide the next phase's peak RSS."""
    trim = getattr(ctypes.CDLL(None), 'malloc_trim', None)
    if trim is not None:
        trim(0)


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
            release_free_heap()
            reset_peak_rss()
            self.base = _status_mb('VmRSS')

    def read(self):
        if self.cuda:
            return torch.cuda.max_memory_allocated() / 2**20
        return _status_mb('VmHWM') - self.base


def synchronizer(device):
    """What makes the host wait for the device before reading the clock."""
    return torch.cuda.synchronize if device == 'cuda' else (lambda: None)


def autocast(args):
    """A fresh autocast context per call (weights are re-cast every call, as
    in a real loop), or none without ``--amp``."""
    if args.amp == 'none':
        return contextlib.nullcontext()
    return torch.autocast(args.device, dtype=getattr(torch,
                                                     AMP_DTYPES[args.amp]))


def grad_scaler():
    """fp16 loss scaling; ``torch.amp.GradScaler`` is torch >= 2.3."""
    if hasattr(torch.amp, 'GradScaler'):
        return torch.amp.GradScaler('cuda')
    return torch.cuda.amp.GradScaler()


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


class BlockTimer:
    """Exclusive wall time per category, via forward hooks on named modules
    (synchronised on a GPU, so that a module's kernels are its own)."""

    def __init__(self, model, sync):
        self.totals = dict.fromkeys([c for c, _ in CATEGORIES], 0.0)
        self.stack = []
        self.sync = sync
        for name, module in model.named_modules():
            leaf = name.rsplit('.', 1)[-1]
            for cat, keys in CATEGORIES:
                if leaf in keys:
                    module.register_forward_pre_hook(self._enter)
                    module.register_forward_hook(
                        lambda m, i, o, cat=cat: self._exit(cat))
                    break

    def _enter(self, module, inputs):
        self.sync()
        self.stack.append([time.perf_counter(), 0.0])

    def _exit(self, cat):
        self.sync()
        start, child = self.stack.pop()
        spent = time.perf_counter() - start
        self.totals[cat] += spent - child
        if self.stack:
            self.stack[-1][1] += spent


def profile_top(forward, sync, device, rows=15):
    """The ops (CUDA kernels on a GPU, aten ops on the CPU) with the most
    self time in one eval forward, by torch.profiler: which kernels a slow
    model spends its time in, where the traffic census only bounds it."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if device == 'cuda':
        activities.append(ProfilerActivity.CUDA)
    with torch.no_grad(), profile(activities=activities) as prof:
        forward()
        sync()
    events = list(prof.key_averages())
    attr = 'self_cpu_time_total'
    if device == 'cuda':  # self device time: the kernels (torch < 2.4: cuda)
        attr = ('self_device_time_total' if events and hasattr(
            events[0], 'self_device_time_total') else 'self_cuda_time_total')
    events = [e for e in events if getattr(e, attr) > 0]
    events.sort(key=lambda e: -getattr(e, attr))
    total = sum(getattr(e, attr) for e in events)
    return dict(total_ms=total / 1e3, top=[
        dict(name=e.key[:90], ms=getattr(e, attr) / 1e3, calls=e.count)
        for e in events[:rows]])


def set_precision(model, precision, device, counted):
    """The fused clustering's distance products in every DPC-kNN reducer;
    returns the precision that applies (:func:`measure`'s row): None
    without a reducer, ``precision`` where the fused op runs on ``device``
    or is ``counted`` (the traffic census), else 'ieee' (the blocked and
    reference backends are IEEE fp32 whatever is asked)."""
    from clustr_mm.models.layers.dpc_knn import DPCKNN, fused
    reducers = [m for m in model.modules() if isinstance(m, DPCKNN)]
    for m in reducers:
        m.precision = precision
    if not reducers:
        return None
    runs = counted or fused.why_not(torch.device(device)) is None
    return precision if runs else 'ieee'


def cuda_path(model):
    """Make ClusTR's clustering take its CUDA path on any device: the fused
    op (on a CPU it runs the blocked code inside, seen as the one op)."""
    from clustr_mm.models.layers.dpc_knn import FUSED_PLAN, use_plan
    use_plan(model, FUSED_PLAN)


def export_tool():
    """``tools/deployment/pytorch2onnx.py`` as a module: the project's one
    export path (and its ONNX Runtime session)."""
    from importlib.util import module_from_spec, spec_from_file_location
    path = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))),
                    'deployment', 'pytorch2onnx.py')
    spec = spec_from_file_location('_benchmark_pytorch2onnx', path)
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def time_onnxruntime(model, x, args):
    """Export ``model`` (a backbone) at ``x``'s static shape with the
    deployment tool, time ONNX Runtime on ``x`` as :func:`measure` times
    eager, and compare its outputs with eager PyTorch's on ``x``."""
    p2o = export_tool()
    path_module = p2o.TensorPath(model, None, 'backbone').eval()
    with tempfile.TemporaryDirectory() as tmp:
        path = osp.join(tmp, 'backbone.onnx')
        t0 = time.perf_counter()
        p2o.export(path_module, x, path)  # static shape, TorchScript, 17
        export_s = time.perf_counter() - t0
        file_mb = osp.getsize(path) / 2**20
        session = p2o.ort_session(path, threads=args.threads)
    feed = {session.get_inputs()[0].name: x.numpy()}
    outputs = []

    def run():
        outputs[:] = session.run(None, feed)

    times, peak = timed_phase(run, args, lambda: None)
    with torch.no_grad():
        expected = path_module(x)
    if len(outputs) != len(expected):
        raise RuntimeError(f'ONNX Runtime gave {len(outputs)} outputs, eager '
                           f'PyTorch {len(expected)}')
    diff = ref = 0.0
    for got, want in zip(outputs, expected):
        got = torch.from_numpy(got)
        if got.shape != want.shape:
            raise RuntimeError(f'ONNX Runtime output of shape '
                               f'{tuple(got.shape)}, eager PyTorch '
                               f'{tuple(want.shape)}')
        diff = max(diff, float((got - want).abs().max()))
        ref = max(ref, float(want.abs().max()))
    runs = times[args.warmup:]
    options = session.get_session_options()
    return dict(ort_first_s=times[0], ort_latency_s=statistics.median(runs),
                ort_runs_s=runs, ort_peak_mem_mb=peak,
                ort_export_s=export_s, onnx_file_mb=file_mb,
                ort_max_abs_diff=diff, max_abs_eager=ref,
                ort_intra_op_threads=options.intra_op_num_threads,
                ort_inter_op_threads=options.inter_op_num_threads)


def measure(name, size, args):
    """One (model, size) measurement; runs inside the child process."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build(name, args.with_cp).to(args.device)
    applied = set_precision(model, args.precision, args.device, args.traffic)
    x = torch.randn(args.batch, 3, *size, device=args.device)
    result = dict(model=name, size=f'{size[0]}x{size[1]}', batch=args.batch,
                  threads=args.threads, compile=args.compile,
                  with_cp=args.with_cp, precision=applied)
    result['params_m'] = sum(p.numel() for p in model.parameters()) / 1e6
    if args.compile != 'none':
        torch._dynamo.reset()
        model = torch.compile(
            model, mode=None if args.compile == 'default' else args.compile,
            fullgraph=True, dynamic=False)

    def forward():
        with autocast(args):
            return model(x)

    if args.traffic:
        from clustr_mm.analysis.traffic import traffic_census
        cuda_path(model)
        if args.train_step:
            model.train()

            def step():
                with autocast(args):
                    loss = sum(o.float().mean() for o in model(x))
                loss.backward()
                model.zero_grad(set_to_none=True)
        else:

            def step():
                with torch.no_grad():
                    forward()

        scale = (args.scale_batch or args.batch) / args.batch
        result.update(traffic_census(
            step, static=list(model.parameters()) + list(model.buffers()),
            scale=scale))
        result['scale_batch'] = args.scale_batch or args.batch
        return result

    if args.census:
        from clustr_mm.analysis.op_census import op_census
        cuda_path(model)
        result.update(op_census(forward, warmup=1))
        return result

    sync = synchronizer(args.device)
    with torch.no_grad():
        times, peak = timed_phase(forward, args, sync)
    runs = times[args.warmup:]
    result.update(first_forward_s=times[0], latency_s=statistics.median(runs),
                  latency_runs_s=runs, peak_forward_mem_mb=peak)
    result['infer_img_s'] = args.batch / result['latency_s']
    if args.runtime == 'onnxruntime':
        result.update(time_onnxruntime(model, x, args))
        result['ort_vs_eager'] = result['ort_latency_s'] / result['latency_s']
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
        result['profile'] = profile_top(forward, sync, args.device)
    if args.flops:
        from clustr_mm.analysis.flops import analyze_flops
        by_op = analyze_flops(model, x).by_operator
        result['gflops'] = sum(by_op.values()) / 1e9
        result['gflops_by_op'] = {k: v / 1e9 for k, v in by_op.most_common()}
        result['gflops_per_s'] = result['gflops'] / result['latency_s']
    if args.train_step:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4,
                                weight_decay=0.05)
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
        result.update(train_step_s=statistics.median(runs),
                      train_runs_s=runs, peak_train_mem_mb=peak)
        result['train_img_s'] = args.batch / result['train_step_s']
    if args.compile != 'none':
        result['compiled_graphs'] = compiled_graphs()
    return result


def compiled_graphs():
    """Graphs dynamo compiled in this process (one per model and mode with
    fullgraph=True); None where torch keeps no such counter."""
    try:
        from torch._dynamo.utils import counters
        return int(counters['stats']['unique_graphs'])
    except (ImportError, KeyError, TypeError):
        return None


def run_child(name, size, args):
    cmd = [sys.executable, osp.abspath(__file__), '--worker', name,
           f'{size[0]}x{size[1]}', '--batch', str(args.batch), '--threads',
           str(args.threads), '--runs', str(args.runs), '--warmup',
           str(args.warmup), '--device', args.device, '--amp', args.amp,
           '--compile', args.compile, '--precision', args.precision,
           '--runtime', args.runtime]
    cmd += [f'--{f}' for f in ('train-step', 'with-cp', 'flops', 'breakdown',
                                'profile', 'census', 'traffic')
            if getattr(args, f.replace('-', '_'))]
    if args.scale_batch:
        cmd += ['--scale-batch', str(args.scale_batch)]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:  # the row says so; the others go on
        return dict(model=name, size=f'{size[0]}x{size[1]}', precision=None,
                    error=f'stopped after --timeout {args.timeout} s')
    for line in proc.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[7:])
    err = (proc.stderr or proc.stdout).strip().splitlines()
    return dict(model=name, size=f'{size[0]}x{size[1]}', precision=None,
                error=err[-1] if err else f'exit {proc.returncode}')


def cpu_name():
    with open('/proc/cpuinfo') as f:
        for line in f:
            if line.startswith('model name'):
                return f'{line.split(":", 1)[1].strip()}, {os.cpu_count()} cores'
    return f'CPU, {os.cpu_count()} cores'


def run_info(args, argv):
    """What the numbers were measured on and with; heads output and JSON."""
    device_name = (torch.cuda.get_device_name() if args.device == 'cuda'
                   else cpu_name())
    # a census counts one forward after one warm-up
    calls = (1, 1) if args.census or args.traffic else (args.warmup,
                                                         args.runs)
    info = dict(device=args.device, device_name=device_name,
                torch=torch.__version__, amp=args.amp,
                compile=args.compile, precision=args.precision,
                runtime=args.runtime, warmup=calls[0],
                runs=calls[1], command=shlex.join(['python', *argv]))
    if args.runtime == 'onnxruntime':
        from importlib.metadata import version
        info.update(onnx=version('onnx'), onnxruntime=version('onnxruntime'))
    return info


def fmt(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) else '-'


class Table:
    """The printed table; its columns depend on the mode."""

    def __init__(self, args):
        self.args = args
        self.throughput = bool(args.device == 'cuda' or args.amp != 'none'
                               or args.train_step)

    def header(self):
        if self.args.traffic:
            return (f'{"model":16s} {"size":>9s} {"ops":>6s} {"GB":>8s} '
                    f'{"GFLOP":>8s} {"bound ms":>9s}  top 3 ops by bound')
        if self.args.runtime == 'onnxruntime':
            return (f'{"model":16s} {"size":>9s} {"params(M)":>9s} '
                    f'{"eager(ms)":>9s} {"ORT(ms)":>9s} {"ORT/eager":>9s} '
                    f'{"max|diff|":>9s} {"export(s)":>9s}')
        if self.args.census:
            return (f'{"model":16s} {"size":>9s} {"ops":>7s} '
                    f'{"host_syncs":>10s}  top 5 ops')
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

    def row(self, r):
        start = f'{r["model"]:16s} {r["size"]:>9s}'
        if 'skipped' in r:
            return f'{start}  skipped ({r["skipped"]})'
        if 'error' in r:
            return f'{start}  failed: {r["error"]}'
        if self.args.traffic:
            top = ', '.join(f'{o["op"]} {o["time_s"] * 1e3:.2f} ms'
                            for o in r['top_ops'][:3])
            return (f'{start} {r["ops"]:6d} {r["bytes"] / 1e9:8.2f} '
                    f'{r["flops"] / 1e9:8.1f} {r["time_bound_s"] * 1e3:9.2f}'
                    f'  {top}')
        if self.args.runtime == 'onnxruntime':
            return (f'{start} {r["params_m"]:9.2f} '
                    f'{r["latency_s"] * 1e3:9.1f} '
                    f'{r["ort_latency_s"] * 1e3:9.1f} '
                    f'{r["ort_vs_eager"]:9.2f} {r["ort_max_abs_diff"]:9.1e} '
                    f'{r["ort_export_s"]:9.1f}')
        if self.args.census:
            top = ', '.join(f'{k} {v}' for k, v in sorted(
                r['by_op'].items(), key=lambda kv: -kv[1])[:5])
            return f'{start} {r["ops"]:7d} {r["host_syncs"]:10d}  {top}'
        if self.throughput:
            line = (f'{start} {r["batch"]:5d} {r["params_m"]:9.2f} '
                    f'{r["infer_img_s"]:11.1f} '
                    f'{r["peak_forward_mem_mb"]:14.0f} '
                    f'{fmt(r.get("train_img_s"), "11.1f"):>11s} '
                    f'{fmt(r.get("peak_train_mem_mb"), "14.0f"):>14s}')
        else:
            line = (f'{start} {r["params_m"]:9.2f} {r["latency_s"]:10.3f} '
                    f'{r["peak_forward_mem_mb"]:9.0f}')
        if self.args.flops:
            line += (f' {r["gflops"]:7.1f} {r["gflops_per_s"]:8.1f}')
        if 'profile' in r:
            p = r['profile']
            line += (f'\n    profile: {p["total_ms"]:.1f} ms of self time '
                     'in one forward; the most:')
            line += ''.join(f'\n      {e["ms"]:9.2f} ms {e["calls"]:5d}x  '
                            f'{e["name"]}' for e in p['top'])
        if 'breakdown_s' in r:
            line += '\n    ' + ', '.join(f'{k} {v:.3f}s'
                                         for k, v in r['breakdown_s'].items())
        return line

    def traffic_ratios(self, rows):
        """Bytes and time bound of each row over each peer's at the same
        size, added to the rows; the lines to print."""
        lines = []
        for peer in TRAFFIC_PEERS:
            ref = next((r for r in rows if r['model'] == peer
                        and 'bytes' in r), None)
            if ref is None:
                continue
            lines.append(f'  relative to {peer} at {ref["size"]}:')
            key = peer.replace('-', '_')
            for r in rows:
                if r is ref or 'bytes' not in r:
                    continue
                r[f'bytes_vs_{key}'] = r['bytes'] / ref['bytes']
                r[f'time_bound_vs_{key}'] = (r['time_bound_s'] /
                                             ref['time_bound_s'])
                lines.append(f'    {r["model"]:16s} bytes '
                             f'{r[f"bytes_vs_{key}"]:.2f}x  time bound '
                             f'{r[f"time_bound_vs_{key}"]:.2f}x  ops '
                             f'{r["ops"] / ref["ops"]:.2f}x')
        return lines

    def ratios(self, rows):
        """img/s of each row over the reference model's at the same size,
        added to the rows; the lines to print."""
        if self.args.traffic:
            return self.traffic_ratios(rows)
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


def check_onnxruntime_args(parser, args):
    """``--runtime onnxruntime`` times fp32 eval forwards on the CPU against
    eager; refuse what it cannot run or would silently leave out."""
    from importlib.util import find_spec
    missing = [m for m in ('onnx', 'onnxruntime') if find_spec(m) is None]
    if missing:
        parser.error(f'--runtime onnxruntime needs {" and ".join(missing)}, '
                     'not installed: pip install -r requirements/onnx.txt '
                     '(or .[onnx])')
    if args.device != 'cpu':
        parser.error(f'--runtime onnxruntime runs the CPU execution provider '
                     f'only; got --device {args.device} (use --device cpu)')
    clash = [f'--amp {args.amp}'] if args.amp != 'none' else []
    if args.compile != 'none':
        clash.append(f'--compile {args.compile}')
    clash += ['--' + f.replace('_', '-') for f in (
        'train_step', 'with_cp', 'flops', 'breakdown', 'profile', 'census',
        'traffic', 'plot') if getattr(args, f)]
    if clash:
        parser.error('--runtime onnxruntime times fp32 eval forwards of the '
                     'eager and the exported backbone; it does not combine '
                     'with ' + ', '.join(clash))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--models', nargs='+', default=[
        'clustr-s-exact', 'clustr-s-window', 'paca-s', 'pvtv2-b2', 'swin-t',
        'resnet50'], choices=sorted(MODELS), metavar='MODEL',
        help=f'any of: {", ".join(sorted(MODELS))}')
    parser.add_argument('--sizes', nargs='+', default=['224', '512'],
                        help='input sizes: S (square) or HxW')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--runs', type=int, default=5,
                        help='timed calls; the median is reported')
    parser.add_argument('--warmup', type=int,
                        help='untimed calls first (default 1 on cpu, 2 on '
                        'cuda)')
    parser.add_argument('--device', choices=('cpu', 'cuda'), default='cpu')
    parser.add_argument('--amp', choices=('none', 'bf16', 'fp16'),
                        default='none',
                        help='autocast dtype for forward and loss')
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
    parser.add_argument('--runtime', choices=('eager', 'onnxruntime'),
                        default='eager',
                        help='onnxruntime: also export each backbone (static '
                        'shape) and time it in ONNX Runtime on the CPU, '
                        'against eager in the same run')
    parser.add_argument('--census', action='store_true',
                        help='instead of timing: aten ops and host syncs of '
                        'one eval forward (the GPU code path on any device)')
    parser.add_argument('--traffic', action='store_true',
                        help='instead of timing: bytes, FLOPs and a roofline '
                        'time bound per op of one eval forward (or forward + '
                        'backward with --train-step); the GPU code path, '
                        'H100 constants: 3.0 TB/s, 600 TFLOP/s bf16/fp16, '
                        '50 TFLOP/s fp32, 165 TFLOP/s for the fused '
                        'clustering with --precision tf32x3 (495 TFLOP/s '
                        'dense TF32 / 3 products), 2.5 us per kernel')
    parser.add_argument('--precision', choices=('ieee', 'tf32x3'),
                        default='tf32x3',
                        help="the distance products of ClusTR's fused "
                        "clustering: tf32x3 (3xTF32 on tensor cores, the "
                        "model's default) or ieee (fp32 FMA products)")
    parser.add_argument('--scale-batch', type=positive_int, metavar='N',
                        help='with --traffic: report batch N, scaling the '
                        'per-image traffic of the --batch run')
    parser.add_argument('--flops', action='store_true',
                        help='count FLOPs (attention and clustering included)')
    parser.add_argument('--breakdown', action='store_true',
                        help='time spent in clustering / attention / MLP')
    parser.add_argument('--profile', action='store_true',
                        help='also profile one eval forward (torch.profiler):'
                        ' the ops with the most self time (CUDA kernels on '
                        'a GPU)')
    parser.add_argument('--timeout', type=positive_int, default=1800,
                        help='seconds per (model, size) child')
    parser.add_argument('--out', help='write all results as JSON here')
    parser.add_argument('--plot', metavar='PNG',
                        help='draw latency and memory versus input size here')
    parser.add_argument('--max-size', nargs='+', default=[],
                        metavar='MODEL=S',
                        help='skip inputs above S x S pixels for MODEL')
    parser.add_argument('--worker', nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.warmup is None:
        # compiling and CUDA-graph recording take the first calls
        args.warmup = (3 if args.compile != 'none' else
                       2 if args.device == 'cuda' else 1)
    if args.runs < 1 or args.warmup < 0 or args.batch < 1:
        parser.error('--runs and --batch must be >= 1, --warmup >= 0')
    if args.threads < 1:
        parser.error(f'--threads must be an int >= 1 (torch threads of each '
                     f'measurement), got {args.threads}')
    if args.census:
        clash = [f for f in ('train_step', 'flops', 'breakdown', 'profile',
                             'plot') if getattr(args, f)]
        if clash:
            parser.error('--census counts the ops of one eval forward; it '
                         'does not combine with ' +
                         ', '.join('--' + f.replace('_', '-') for f in clash))
    if args.traffic:
        clash = [f for f in ('census', 'flops', 'breakdown', 'profile',
                             'plot') if getattr(args, f)]
        if clash:
            parser.error('--traffic counts the ops of one call; it does not '
                         'combine with ' + ', '.join(
                             '--' + f.replace('_', '-') for f in clash))
    if args.scale_batch is not None and (not args.traffic
                                         or args.scale_batch < 1):
        parser.error(f'--scale-batch takes a batch >= 1 and needs '
                     f'--traffic, got {args.scale_batch}')
    if args.compile != 'none':
        clash = [f for f in ('census', 'traffic', 'flops', 'breakdown',
                             'profile') if getattr(args, f)]
        if clash:
            parser.error('--compile times the compiled model; ' +
                         ', '.join('--' + f for f in clash) +
                         ' need the eager one (run them without --compile)')
    if args.runtime == 'onnxruntime':
        check_onnxruntime_args(parser, args)
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
    max_pixels = {}
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
        max_pixels[name] = h * w
    args.max_pixels = max_pixels
    return args


def main(argv=None):
    argv = sys.argv if argv is None else argv
    args = parse_args(argv[1:])
    if args.worker:
        result = measure(args.worker[0], parse_size(args.worker[1]), args)
        print('RESULT ' + json.dumps(result))
        return

    info = run_info(args, argv)
    print(f'device: {info["device"]} ({info["device_name"]}) | torch '
          f'{info["torch"]} | batch {args.batch} | amp {args.amp} | '
          f'compile {args.compile} | with_cp {args.with_cp} | '
          f'warm-up {info["warmup"]}, runs {info["runs"]} | threads '
          f'{args.threads}' + (
              f' | onnxruntime {info["onnxruntime"]} (CPU EP, intra-op '
              f'{args.threads}, inter-op 1) | onnx {info["onnx"]}'
              if args.runtime == 'onnxruntime' else ''))
    print(f'command: {info["command"]}')
    table = Table(args)
    print(table.header(), flush=True)
    results = []
    for size in map(parse_size, args.sizes):
        rows = []
        for name in args.models:
            if size[0] * size[1] > args.max_pixels.get(name, float('inf')):
                r = dict(model=name, size=f'{size[0]}x{size[1]}',
                         skipped='above --max-size', precision=None)
            else:
                r = run_child(name, size, args)
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
    if args.plot:
        sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
        from plot_benchmark import plot
        plot(results, args.plot)
        print(f'wrote {args.plot}')


if __name__ == '__main__':
    main()

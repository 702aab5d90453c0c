"""Backbone latency, peak memory, training-step time and FLOP/s, with peers.

    python tools/analysis/benchmark.py --models clustr-s-exact clustr-s-window \
        paca-s pvtv2-b2 swin-t resnet50 --sizes 224 512 800x1344 \
        [--batch 1] [--threads 2] [--runs 5] [--train-step] [--flops] \
        [--breakdown] [--out results.json] [--plot plot.png] \
        [--max-size clustr-s-exact=640]

Every (model, size) is measured in a fresh child process, so peak memory is
that of one forward pass (the kernel's peak RSS during the first forward
minus the RSS before it) and no measurement is polluted by an earlier one. Latency is the median
of ``--runs`` forwards after one warm-up. Peers come from the installed mmdet.
``--max-size MODEL=S`` skips a model's inputs larger than S x S pixels (exact
ClusTR is quadratic in the tokens); ``--plot`` draws latency and peak memory
against the input side with log-log scaling exponents
(``tools/analysis/plot_benchmark.py``, which also replots a saved JSON).
"""
import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import time

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

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


def parse_size(text):
    h, _, w = text.partition('x')
    return int(h), int(w or h)


def build(name):
    import clustr_mm  # noqa: F401
    import mmdet.models  # noqa: F401  (registers the peers)
    from mmengine.registry import MODELS as ROOT
    from mmdet.registry import MODELS as DET
    cfg = dict(MODELS[name])
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


class BlockTimer:
    """Exclusive wall time per category, via forward hooks on named modules."""

    def __init__(self, model):
        self.totals = dict.fromkeys([c for c, _ in CATEGORIES], 0.0)
        self.stack = []
        for name, module in model.named_modules():
            leaf = name.rsplit('.', 1)[-1]
            for cat, keys in CATEGORIES:
                if leaf in keys:
                    module.register_forward_pre_hook(self._enter)
                    module.register_forward_hook(
                        lambda m, i, o, cat=cat: self._exit(cat))
                    break

    def _enter(self, module, inputs):
        self.stack.append([time.perf_counter(), 0.0])

    def _exit(self, cat):
        start, child = self.stack.pop()
        spent = time.perf_counter() - start
        self.totals[cat] += spent - child
        if self.stack:
            self.stack[-1][1] += spent


def measure(name, size, args):
    """One (model, size) measurement; runs inside the child process."""
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build(name)
    x = torch.randn(args.batch, 3, *size)
    result = dict(model=name, size=f'{size[0]}x{size[1]}', batch=args.batch,
                  threads=args.threads)
    result['params_m'] = sum(p.numel() for p in model.parameters()) / 1e6
    reset_peak_rss()
    rss0 = _status_mb('VmRSS')
    with torch.no_grad():
        t0 = time.perf_counter()
        model(x)
        result['first_forward_s'] = time.perf_counter() - t0
        result['peak_forward_mem_mb'] = _status_mb('VmHWM') - rss0
        times = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    result['latency_s'] = statistics.median(times)
    result['latency_runs_s'] = times
    if args.breakdown:
        timer = BlockTimer(model)
        with torch.no_grad():
            t0 = time.perf_counter()
            model(x)
            total = time.perf_counter() - t0
        result['breakdown_s'] = dict(timer.totals, total=total)
    if args.flops:
        from clustr_mm.utils.flops import count_flops
        by_op = count_flops(model, x.shape)
        result['gflops'] = sum(by_op.values()) / 1e9
        result['gflops_by_op'] = {k: v / 1e9 for k, v in by_op.most_common()}
        result['gflops_per_s'] = result['gflops'] / result['latency_s']
    if args.train_step:
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        steps = []
        for i in range(args.runs + 1):
            t0 = time.perf_counter()
            loss = sum(o.float().mean() for o in model(x))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i:  # the first step is warm-up
                steps.append(time.perf_counter() - t0)
        result['train_step_s'] = statistics.median(steps)
    return result


def run_child(name, size, args):
    cmd = [sys.executable, osp.abspath(__file__), '--worker', name,
           f'{size[0]}x{size[1]}', '--batch', str(args.batch), '--threads',
           str(args.threads), '--runs', str(args.runs)]
    cmd += [f'--{f}' for f in ('train-step', 'flops', 'breakdown')
            if getattr(args, f.replace('-', '_'))]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                          timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith('RESULT '):
            return json.loads(line[7:])
    err = (proc.stderr or proc.stdout).strip().splitlines()
    return dict(model=name, size=f'{size[0]}x{size[1]}',
                error=err[-1] if err else f'exit {proc.returncode}')


def fmt(value, spec):
    return format(value, spec) if isinstance(value, (int, float)) else '-'


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--models', nargs='+', default=[
        'clustr-s-exact', 'clustr-s-window', 'paca-s', 'pvtv2-b2', 'swin-t',
        'resnet50'], choices=sorted(MODELS), metavar='MODEL',
        help=f'any of: {", ".join(sorted(MODELS))}')
    parser.add_argument('--sizes', nargs='+', default=['224', '512'],
                        help='input sizes: S (square) or HxW')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--runs', type=int, default=5)
    parser.add_argument('--train-step', action='store_true',
                        help='also time forward + backward + SGD step')
    parser.add_argument('--flops', action='store_true',
                        help='count FLOPs (attention and clustering included)')
    parser.add_argument('--breakdown', action='store_true',
                        help='time spent in clustering / attention / MLP')
    parser.add_argument('--timeout', type=int, default=1800,
                        help='seconds per (model, size) child')
    parser.add_argument('--out', help='write all results as JSON here')
    parser.add_argument('--plot', metavar='PNG',
                        help='draw latency and memory versus input size here')
    parser.add_argument('--max-size', nargs='+', default=[],
                        metavar='MODEL=S',
                        help='skip inputs above S x S pixels for MODEL')
    parser.add_argument('--worker', nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        result = measure(args.worker[0], parse_size(args.worker[1]), args)
        print('RESULT ' + json.dumps(result))
        return

    max_pixels = {}
    for item in args.max_size:
        name, _, size = item.partition('=')
        if name not in MODELS or not size:
            parser.error(f'--max-size takes MODEL=S, got {item!r}')
        h, w = parse_size(size)
        max_pixels[name] = h * w

    results = []
    head = (f'{"model":16s} {"size":>9s} {"params(M)":>9s} {"latency(s)":>10s} '
            f'{"peak(MB)":>9s} {"train(s)":>8s} {"GFLOPs":>7s} {"GFLOP/s":>8s}')
    print(head)
    for size in map(parse_size, args.sizes):
        for name in args.models:
            if size[0] * size[1] > max_pixels.get(name, float('inf')):
                results.append(dict(model=name, size=f'{size[0]}x{size[1]}',
                                    skipped='above --max-size'))
                print(f'{name:16s} {size[0]}x{size[1]:<5d}  skipped '
                      '(--max-size)', flush=True)
                continue
            r = run_child(name, size, args)
            results.append(r)
            if 'error' in r:
                print(f'{name:16s} {r["size"]:>9s}  failed: {r["error"]}')
                continue
            print(f'{name:16s} {r["size"]:>9s} {r["params_m"]:9.2f} '
                  f'{r["latency_s"]:10.3f} {r["peak_forward_mem_mb"]:9.0f} '
                  f'{fmt(r.get("train_step_s"), "8.3f"):>8s} '
                  f'{fmt(r.get("gflops"), "7.1f"):>7s} '
                  f'{fmt(r.get("gflops_per_s"), "8.1f"):>8s}', flush=True)
            if 'breakdown_s' in r:
                print('    ' + ', '.join(f'{k} {v:.3f}s'
                                         for k, v in r['breakdown_s'].items()))
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

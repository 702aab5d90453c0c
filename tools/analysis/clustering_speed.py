"""Where ClusTR's clustering spends its time on a GPU, measured on the tokens
it really clusters:

    python tools/analysis/clustering_speed.py [--arch small] [--batch 128] \
        [--size 224] [--runs 10] [--baseline OLD_FUSED.py] [--peer pvtv2-b2] \
        [--out clustering_speed.json]

ClusTR (random weights, seed 0; random-normal images, bf16 autocast as the
benchmark runs it) does one eval forward; the first clustering call of each
stage is kept (its LayerNorm'd tokens, windows and cluster counts). On each:

- CUDA-event times (median of ``--runs`` after 3 warm-ups) of the fused op
  in both precisions and of its parts (prep, pass 1, density gather and
  order, pass 2, center order, assignment);
- the same with pass 2 pruned by pass 1's nearest other token
  (``fused.kernel_config(..., prune=True)``) beside the full scan: times,
  parts, the share of tokens pass 2 still scans, ids against the full
  scan's;
- agreement with the reference backend on the same tokens
  (:func:`~clustr_mm.ops.dpc_knn.agreement.compare`: values
  within their round-off bounds, ids equal but at near-ties) and the ids
  that summing fp32 in another order changes (the reference with its
  channels reversed: fp32's own floor);
- ``--baseline``: another implementation of the op (a module file with a
  ``_triton_passes`` of the same arguments, e.g. an earlier ``fused.py``),
  timed and its ids compared. It is loaded inside ``clustr_mm.ops.dpc_knn``
  (its relative imports resolve there), so a file from before a change of
  that package needs its imports brought up to date and its op renamed, e.g.
  the row-scan kernels of git ``ae99eaa``
  (``clustr_mm/models/layers/dpc_knn/fused.py`` then): ``FUSED_PLAN`` from
  ``.dispatch``, and ``clustr_mm::dpc_knn`` as ``clustr_mm::dpc_knn_old``;
- the official code's formulation (``cluster_dpc_knn_ms``: cdist, topk and
  dense masks over whole distance blocks, in 4 batch chunks; without its
  1e-6 density noise), timed.

Then the whole forward, and the forward with every call's cluster ids
cached from a first forward (the network alone), beside ``--peer`` (a
``benchmark_common.py`` model; skipped with the reason if it cannot be
built).
GPU only.
"""
import argparse
import json
import math
import os.path as osp
import shlex
import sys
from importlib.util import module_from_spec, spec_from_file_location

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))

from clustr_mm.engine.cli_args import new_file, positive_int  # noqa: E402

WARMUP = 3


def cuda_time(fn, runs):
    """Median milliseconds of ``fn`` by CUDA events, after warm-ups."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(runs):
        start, stop = (torch.cuda.Event(enable_timing=True) for _ in 'ab')
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def capture_calls(model, images):
    """(stage, x, counts, k, windows, plan) of every clustering call of one
    eval forward, in call order."""
    from clustr_mm.ops.dpc_knn import dispatch
    fused_backend = dispatch.BACKENDS[0]  # the checked fused backend
    calls, original = [], fused_backend.run

    def record(x, counts, k, windows, plan):
        calls.append((x.clone(), list(counts), k, windows, plan))
        return original(x, counts, k, windows, plan)

    fused_backend.run = record
    try:
        with torch.no_grad(), torch.autocast('cuda', torch.bfloat16):
            model(images)
    finally:
        del fused_backend.run  # back to the class's method
    return calls


def parts(x, counts, k, windows, precision, config=None):
    """The fused op's steps as :func:`fused._triton_passes` runs them, with
    an event after each: {part: event} (``config``: the kernels' layout,
    ``fused.kernel_config``'s unless given)."""
    from clustr_mm.ops.dpc_knn import fused
    events = {}
    config = config or fused.kernel_config(x.device, x.shape[2], precision)

    def mark(name):
        events[name] = torch.cuda.Event(enable_timing=True)
        events[name].record()
    mark('start')
    hi, lo, sq, tie = fused._prep(x, windows.invalid, precision)
    mark('prep')
    pass1 = fused._knn_pass(hi, lo, sq, tie, windows.knn_scale,
                            min(k, x.shape[1]), precision, config)
    mark('pass1')
    rho = pass1.rho.gather(1, pass1.first)
    order = torch.sort(rho, dim=1, descending=True, stable=True).indices
    mark('order')
    _, score = fused._denser_pass(hi, lo, sq, tie, order, rho, pass1.rowmax,
                                  precision, config, pass1)
    mark('pass2')
    centers = torch.sort(score, dim=1, descending=True,
                         stable=True).indices[:, :max(counts)].contiguous()
    mark('centers')
    fused._assign(hi, lo, sq, tie, centers, counts, windows.center_slots,
                  precision)
    mark('assign')
    return events


def time_parts(x, counts, k, windows, precision, runs, config=None):
    """Median milliseconds of each part (:func:`parts`)."""
    for _ in range(WARMUP):
        parts(x, counts, k, windows, precision, config)
    samples = []
    for _ in range(runs):
        events = parts(x, counts, k, windows, precision, config)
        torch.cuda.synchronize()
        names = list(events)
        samples.append({b: events[a].elapsed_time(events[b])
                        for a, b in zip(names, names[1:])})
    return {name: sorted(s[name] for s in samples)[runs // 2]
            for name in samples[0]}


# --sweep: layouts of passes 1 and 2 in 'tf32x3' by channels, each free of
# spills on sm_90 (ptxas, Triton 3.6 and 3.8); (warps, rows once, stages).
# Up to fused.PRUNE_MAX_CHANNELS each is also timed with pass 2 pruned
# (KernelConfig.prune_denser; not every one of those checked for spills).
SWEEP = {64: [(4, True, 1), (8, True, 1), (4, True, 2)],
         128: [(4, False, 1), (4, False, 2), (8, False, 1), (8, False, 2),
               (8, False, 3), (8, True, 2), (8, True, 3)],
         256: [(4, False, 1), (4, False, 2), (8, False, 1), (8, False, 2),
               (8, False, 3)]}


def sweep(calls, runs):
    """Per stage, passes 1 and 2 ('tf32x3') timed in each layout of
    :data:`SWEEP` (and pruned, up to ``fused.PRUNE_MAX_CHANNELS``); the
    fastest is put in ``fused.MEASURED`` for the rest of the run. Returns
    {channels: {layout: ms}}."""
    from clustr_mm.ops.dpc_knn import fused
    out, seen = {}, set()
    for x, counts, k, windows, _ in calls:
        c = x.shape[-1]
        if c in seen or c not in SWEEP:
            continue
        seen.add(c)
        x = x.float().contiguous()
        hi, lo, sq, tie = fused._prep(x, windows.invalid, 'tf32x3')
        pass1 = fused._knn_pass(hi, lo, sq, tie, windows.knn_scale, k,
                                'tf32x3')
        rho, rowmax = pass1.rho.gather(1, pass1.first), pass1.rowmax
        order = torch.sort(rho, dim=1, descending=True, stable=True).indices
        prunes = (False, True) if c <= fused.PRUNE_MAX_CHANNELS else (False, )
        layouts = {str((*layout, 'pruned') if prune else layout):
                   fused.KernelConfig(*layout, prune_denser=prune)
                   for layout in SWEEP[c] for prune in prunes}

        def passes(config):
            first = fused._knn_pass(hi, lo, sq, tie, windows.knn_scale, k,
                                    'tf32x3', config)
            fused._denser_pass(hi, lo, sq, tie, order, rho, rowmax, 'tf32x3',
                               config, first)
        times = {name: cuda_time(lambda: passes(config), runs)
                 for name, config in layouts.items()}
        best = min(times, key=times.get)
        major = torch.cuda.get_device_capability()[0]
        fused.MEASURED[(major, c, 'tf32x3')] = layouts[best]
        out[c] = dict(ms=times, fastest=best)
        print(f'[sweep] {x.shape[1]} tokens x {c}: {times}; fastest {best}',
              flush=True)
    return out


def official_dpc_knn(x, counts, k, chunks=4):
    """The official ``cluster_dpc_knn_ms`` formulation (whole distance
    blocks, batch in ``chunks``; no density noise): (S, G, n) ids."""
    g, n, c = x.shape
    num = max(counts)
    out = []
    for xs in x.chunk(chunks):
        d = torch.cdist(xs, xs) / math.sqrt(c)
        near = d.topk(k, -1, largest=False).values
        rho = (-(near ** 2).mean(-1)).exp()
        denser = rho[:, None, :] > rho[:, :, None]
        dmax = d.flatten(1).amax(-1)[:, None, None]
        parent = torch.where(denser, d, dmax).amin(-1)
        centers = (parent * rho).topk(num, -1).indices
        to_centers = d.gather(1, centers[..., None].expand(-1, -1, n))
        ids = []
        for count in counts:
            own = to_centers[:, :count].argmin(1)
            ids.append(own.scatter(1, centers[:, :count], torch.arange(
                count, device=x.device).expand(xs.shape[0], -1)))
        out.append(torch.stack(ids))
    return torch.cat(out, 1)


def load_baseline(path):
    """A module file with ``_triton_passes`` (an earlier fused.py), loaded
    inside the dpc_knn package so its relative imports resolve."""
    name = 'clustr_mm.ops.dpc_knn._baseline'
    spec = spec_from_file_location(name, path)
    module = module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def stage_rows(calls, args):
    """Per stage (first call): times, parts and agreement."""
    from clustr_mm.ops.dpc_knn import FUSED_PLAN, fused
    from clustr_mm.ops.dpc_knn.agreement import compare
    from clustr_mm.ops.dpc_knn.reference import dpc_knn_reference
    baseline = load_baseline(args.baseline) if args.baseline else None
    rows, seen = [], set()
    for x, counts, k, windows, _ in calls:
        if x.shape[1:] in seen:
            continue
        seen.add(x.shape[1:])
        x = x.float().contiguous()
        g, n, c = x.shape
        row = dict(windows=g, tokens=n, channels=c, counts=counts,
                   calls=sum(1 for y, *_ in calls if y.shape == x.shape))
        ref_probe = {}
        ref_ids = dpc_knn_reference(x, counts, k, windows, probe=ref_probe)
        flipped = dpc_knn_reference(x.flip(-1), counts, k, windows)
        total = ref_ids.numel()
        row['fp32_reordered_ids_pct'] = 100 * float(
            (flipped != ref_ids).sum()) / total
        for precision in ('ieee', 'tf32x3'):
            ids, got = fused.probed(x, counts, k, windows,
                                    FUSED_PLAN._replace(precision=precision))
            report = compare(x, counts, windows, ref_probe, got, ref_ids,
                             ids, precision)
            row[precision] = dict(
                op_ms=cuda_time(lambda: fused.dpc_knn_fused(
                    x, counts, k, windows, precision), args.runs),
                parts_ms=time_parts(x, counts, k, windows, precision,
                                    args.runs),
                ids_vs_reference_pct=100 * report['id_mismatches'] / total,
                agreement=report)
            row[precision]['pruned'] = pruned_row(
                x, counts, k, windows, precision, args.runs)
            if baseline is not None:
                old = baseline._triton_passes(x, counts, k, windows,
                                              precision)
                row[precision]['baseline_ms'] = cuda_time(
                    lambda: baseline._triton_passes(x, counts, k, windows,
                                                    precision), args.runs)
                row[precision]['ids_vs_baseline_pct'] = 100 * float(
                    (old != ids).sum()) / total
        del ref_probe, ref_ids, flipped
        torch.cuda.empty_cache()
        row['official_ms'] = cuda_time(
            lambda: official_dpc_knn(x, counts, k), args.runs)
        rows.append(row)
        print(json.dumps(row)[:2000], flush=True)
    return rows


def pruned_row(x, counts, k, windows, precision, runs):
    """Pass 2 pruned by pass 1's nearest other token
    (``KernelConfig.prune_denser``) beside the same layout without it
    (whichever the default is): the implementation's milliseconds both
    ways, the pruned parts, the share of tokens pass 2 still scans and the
    ids that differ between the two."""
    from clustr_mm.ops.dpc_knn import fused
    config = fused.kernel_config(x.device, x.shape[2], precision, prune=True)
    if not config.prune_denser:
        return dict(skipped=f'fused.kernel_config prunes no layout for '
                    f'{x.shape[2]} channels in {precision} here')
    plain = config._replace(prune_denser=False)
    hi, lo, sq, tie = fused._prep(x, windows.invalid, precision)
    pass1 = fused._knn_pass(hi, lo, sq, tie, windows.knn_scale,
                            min(k, x.shape[1]), precision, config)
    settled = fused.settled_by_nearest(pass1,
                                       pass1.rho.gather(1, pass1.first))
    got, full = (fused._triton_passes(x, counts, k, windows, precision,
                                      config=layout)
                 for layout in (config, plain))
    return dict(
        passes_ms=cuda_time(lambda: fused._triton_passes(
            x, counts, k, windows, precision, config=config), runs),
        unpruned_passes_ms=cuda_time(lambda: fused._triton_passes(
            x, counts, k, windows, precision, config=plain), runs),
        parts_ms=time_parts(x, counts, k, windows, precision, runs, config),
        scanned_pct=100 * float((~settled).float().mean()),
        ids_vs_unpruned_pct=100 * float((got != full).sum()) / full.numel())


def network_alone(model, images, calls, peer, runs):
    """Forward ms with the clustering and with every call's ids cached (the
    network alone), and ``peer``'s forward, in this process."""
    from clustr_mm.ops.dpc_knn import dispatch
    ids = []
    fused_backend = dispatch.BACKENDS[0]  # the checked fused backend
    original = fused_backend.run

    def cached(x, counts, k, windows, plan, it=[0]):
        out = ids[it[0] % len(ids)]
        it[0] += 1
        return out

    def forward(net):
        with torch.no_grad(), torch.autocast('cuda', torch.bfloat16):
            net(images)

    out = dict(full_ms=cuda_time(lambda: forward(model), runs))
    for x, counts, k, windows, plan in calls:
        ids.append(original(x, counts, k, windows, plan))
    fused_backend.run = cached
    try:
        out['cached_ids_ms'] = cuda_time(lambda: forward(model), runs)
    finally:
        del fused_backend.run  # back to the class's method
    out['clustering_ms'] = out['full_ms'] - out['cached_ids_ms']
    try:
        from benchmark_common import build
        net = build(peer).cuda()
        out[f'{peer}_ms'] = cuda_time(lambda: forward(net), runs)
    except Exception as e:  # the peer needs mmdet with mmcv's ops
        out[f'{peer}_error'] = f'{type(e).__name__}: {e}'[:300]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--arch', default='small',
                        choices=('tiny', 'small', 'base'))
    parser.add_argument('--batch', type=positive_int, default=128)
    parser.add_argument('--size', type=positive_int, default=224)
    parser.add_argument('--runs', type=positive_int, default=10)
    parser.add_argument('--baseline', help='a module file with another '
                        '_triton_passes to time beside this one')
    parser.add_argument('--peer', default='pvtv2-b2',
                        help='benchmark.py model timed beside the network')
    parser.add_argument('--sweep', action='store_true',
                        help='first time the layouts of passes 1 and 2 '
                        '(SWEEP) and use the fastest for the rest')
    parser.add_argument('--out', type=new_file,
                        help='write the results as JSON here')
    args = parser.parse_args(argv)
    if args.baseline and not osp.isfile(args.baseline):
        parser.error(f'argument --baseline: {args.baseline!r} is not a file')
    if not torch.cuda.is_available():
        parser.error('this tool times CUDA kernels: torch.cuda.is_available()'
                     ' is False')
    from provenance import software
    from clustr_mm.models.backbones.clustr import ClusTR
    from clustr_mm.ops.dpc_knn import fused
    torch.manual_seed(0)
    model = ClusTR(args.arch, clustering_mode='exact').cuda().eval()
    images = torch.randn(args.batch, 3, args.size, args.size, device='cuda')
    calls = capture_calls(model, images)
    swept = sweep(calls, args.runs) if args.sweep else None
    result = dict(
        sweep=swept, layouts={str(key): value._asdict() for key, value in
                              fused.MEASURED.items()},
        device=torch.cuda.get_device_name(), torch=torch.__version__,
        **software('cuda'), arch=args.arch, batch=args.batch,
        size=args.size, runs=args.runs, warmup=WARMUP, amp='bf16',
        command=shlex.join(['python', *sys.argv]),
        stages=stage_rows(calls, args),
        network=network_alone(model, images, calls, args.peer, args.runs))
    print(json.dumps(result['network']))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == '__main__':
    main()

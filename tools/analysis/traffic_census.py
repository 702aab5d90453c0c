"""Traffic census of backbones: bytes moved, FLOPs and a roofline time bound
per op of one eval forward (``--train-step``: one forward + backward).

    python tools/analysis/traffic_census.py --amp bf16 --batch 2 \
        --scale-batch 128 --sizes 224 --models clustr-s-window paca-s \
        pvtv2-b2 swin-t
    python tools/analysis/traffic_census.py --amp bf16 --batch 2 \
        --train-step --sizes 800x1344 --models clustr-s-window paca-s \
        pvtv2-b2 swin-t

No timing, on any device, the GPU code path (ClusTR's fused clustering op):
``clustr_mm.analysis.traffic`` of one call after a warm-up one gives per op
the bytes read and written at the dtype it ran in, its FLOPs
(``torch.utils.flop_counter``), and a roofline time bound
``max(bytes / 3.0 TB/s, FLOPs / peak, 2.5 us)`` with peak ~600 TFLOP/s for
bf16/fp16 inputs and ~50 TFLOP/s for fp32 (an H100's, rounded); then totals,
the ten biggest ops, and each model's ratios to ``swin-t`` and ``pvtv2-b2``
when they ran. ``--scale-batch N`` reports batch N from a ``--batch`` run:
ops on weights alone keep their traffic, all others are scaled by
N / batch. The fused clustering counts as one op with its real inputs,
outputs and FLOPs; with ``--precision tf32x3`` (the default) its FLOPs run
at ~165 TFLOP/s (3xTF32: three products at the ~495 TFLOP/s dense TF32 peak
per fp32 product), and each row's ``precision`` is the counted one (None
for a model without the clustering). Models, rows and the child process per
(model, size) are ``benchmark_common.py``'s.
"""
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from benchmark_common import (Table, autocast, cuda_path,  # noqa: E402
                              parse_common, parser_for, prepare, run,
                              run_info)
from clustr_mm.engine.cli_args import positive_int  # noqa: E402

PEERS = ('swin-t', 'pvtv2-b2')  # traffic ratios against these


def measure(name, size, args):
    """One (model, size) census; runs inside the child process."""
    from clustr_mm.analysis.traffic import traffic_census
    model, x, result = prepare(name, size, args, counted=True)
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
            with torch.no_grad(), autocast(args):
                model(x)

    scale = (args.scale_batch or args.batch) / args.batch
    result.update(traffic_census(
        step, static=list(model.parameters()) + list(model.buffers()),
        scale=scale))
    result['scale_batch'] = args.scale_batch or args.batch
    return result


class TrafficTable(Table):

    def header(self):
        return (f'{"model":16s} {"size":>9s} {"ops":>6s} {"GB":>8s} '
                f'{"GFLOP":>8s} {"bound ms":>9s}  top 3 ops by bound')

    def cells(self, r):
        top = ', '.join(f'{o["op"]} {o["time_s"] * 1e3:.2f} ms'
                        for o in r['top_ops'][:3])
        return (f'{r["ops"]:6d} {r["bytes"] / 1e9:8.2f} '
                f'{r["flops"] / 1e9:8.1f} {r["time_bound_s"] * 1e3:9.2f}'
                f'  {top}')

    def ratios(self, rows):
        """Bytes and time bound of each row over each peer's at the same
        size, added to the rows; the lines to print."""
        lines = []
        for peer in PEERS:
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


def main(argv=None):
    argv = sys.argv if argv is None else argv
    parser = parser_for(__doc__, timed=False)
    parser.add_argument('--train-step', action='store_true',
                        help='count forward + backward instead of the eval '
                        'forward')
    parser.add_argument('--scale-batch', type=positive_int, metavar='N',
                        help='report batch N, scaling the per-image traffic '
                        'of the --batch run')
    args = parse_common(parser, argv[1:])
    info = None if args.worker else run_info(args, argv, calls=(1, 1))
    return run(osp.abspath(__file__), args, argv, measure,
               TrafficTable(args), info)


if __name__ == '__main__':
    main()

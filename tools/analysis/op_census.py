"""Op census of backbones: aten ops and host syncs of one eval forward.

    python tools/analysis/op_census.py --batch 2 --sizes 224 512 800x1344 \
        [--models clustr-s-window paca-s pvtv2-b2] [--amp bf16] [--out x.json]

No timing: ``clustr_mm.analysis.op_census`` of one eval forward after a
warm-up one: the ops (about the kernel launches on a GPU), the launches
with those inside the project's own ops (ClusTR's clustering and merge)
counted, per call of each, the host syncs and the most frequent ops. ClusTR's clustering runs its CUDA path
(``FUSED_PLAN`` in ``dpc_knn``: the fused op) on every device, so a CPU
census counts the GPU's code path. Models, rows and the child process per
(model, size) are ``benchmark_common.py``'s.
"""
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from benchmark_common import (Table, autocast, cuda_path,  # noqa: E402
                              parse_common, parser_for, prepare, run,
                              run_info)


def measure(name, size, args):
    """One (model, size) census; runs inside the child process."""
    from clustr_mm.analysis.op_census import op_census
    model, x, result = prepare(name, size, args)
    cuda_path(model)

    def forward():
        with autocast(args):
            return model(x)

    result.update(op_census(forward, warmup=1))
    return result


class CensusTable(Table):

    def header(self):
        return (f'{"model":16s} {"size":>9s} {"ops":>7s} {"launches":>8s} '
                f'{"host_syncs":>10s}  top 5 ops; launches per own-op call')

    def cells(self, r):
        top = ', '.join(f'{k} {v}' for k, v in sorted(
            r['by_op'].items(), key=lambda kv: -kv[1])[:5])
        own = ', '.join(f'{k} {v}' for k, v in
                        r.get('launches_per_call', {}).items())
        return (f'{r["ops"]:7d} {r.get("launches", r["ops"]):8d} '
                f'{r["host_syncs"]:10d}  {top}' + (f'; {own}' if own else ''))


def main(argv=None):
    argv = sys.argv if argv is None else argv
    args = parse_common(parser_for(__doc__, timed=False), argv[1:])
    # a census counts one forward after one warm-up
    info = None if args.worker else run_info(args, argv, calls=(1, 1))
    return run(osp.abspath(__file__), args, argv, measure, CensusTable(args),
               info)


if __name__ == '__main__':
    main()

"""Latency and peak memory versus input size, with log-log scaling exponents.

    python tools/analysis/plot_benchmark.py RESULTS.json --out plot.png

RESULTS.json is what ``tools/analysis/benchmark.py --out`` writes (or use
``benchmark.py --plot``). Two panels, both log-log against the input side
(square inputs; for HxW the side is sqrt(H*W)): forward latency (best of the
runs: the least disturbed by other load on the machine) and the forward's
peak memory. Each curve's legend entry gives its exponent k in
``cost ~ pixels^k``, a least-squares line through the points whose side is
at least ``--fit-from`` (default 384: at 224 fixed overheads dominate); k = 1
is linear in the number of pixels, k = 2 quadratic.
"""
import argparse
import json
import math
import os
import os.path as osp
from typing import Dict, List, Optional

LABELS = {
    'clustr-t-exact': 'ClusTR-T exact', 'clustr-s-exact': 'ClusTR-S exact',
    'clustr-b-exact': 'ClusTR-B exact', 'clustr-t-window': 'ClusTR-T window',
    'clustr-s-window': 'ClusTR-S window',
    'clustr-b-window': 'ClusTR-B window', 'paca-t': 'PaCa-T',
    'paca-s': 'PaCa-S', 'paca-b': 'PaCa-B', 'pvtv2-b2': 'PVTv2-b2',
    'swin-t': 'Swin-T', 'resnet50': 'ResNet-50',
}
STYLES = {
    'clustr-s-exact': dict(color='tab:red', marker='o'),
    'clustr-s-window': dict(color='tab:orange', marker='s'),
    'paca-s': dict(color='tab:blue', marker='^'),
    'pvtv2-b2': dict(color='tab:green', marker='D'),
    'swin-t': dict(color='tab:purple', marker='v'),
    'resnet50': dict(color='tab:gray', marker='x'),
}


def side(size: str) -> float:
    h, _, w = size.partition('x')
    return math.sqrt(int(h) * int(w or h))


def latency(r: dict) -> float:
    runs = r.get('latency_runs_s')
    return min(runs) if runs else r['latency_s']


def exponent(points: List[tuple], fit_from: float) -> Optional[float]:
    """Slope of log(cost) against log(pixels) over sides >= fit_from."""
    pts = [(s * s, c) for s, c in points if s >= fit_from and c > 0]
    if len(pts) < 2:
        return None
    xs = [math.log(p) for p, _ in pts]
    ys = [math.log(c) for _, c in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx)**2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


def curves(results: List[dict]) -> Dict[str, dict]:
    """Per model: measured (side, latency, memory) and the sizes not run."""
    out: Dict[str, dict] = {}
    for r in results:
        c = out.setdefault(r['model'], dict(points=[], missing=[]))
        if 'error' in r or 'skipped' in r:
            c['missing'].append((side(r['size']),
                                 r.get('skipped') or r.get('error')))
        else:
            c['points'].append((side(r['size']), latency(r),
                                r['peak_forward_mem_mb']))
    for c in out.values():
        c['points'].sort()
    return out


def plot(results: List[dict], path: str, fit_from: float = 384) -> dict:
    """Draw the figure to ``path``; returns the exponents per model."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    data = curves(results)
    fig, axes = plt.subplots(1, 2, figsize=(12, 6.4))
    exps = {}
    sides = sorted({p[0] for c in data.values() for p in c['points']})
    for ax, idx, what in ((axes[0], 1, 'latency'), (axes[1], 2, 'memory')):
        for name, c in data.items():
            if not c['points']:
                continue
            xs = [p[0] for p in c['points']]
            ys = [p[idx] for p in c['points']]
            k = exponent([(p[0], p[idx]) for p in c['points']], fit_from)
            exps.setdefault(name, {})[what] = k
            label = LABELS.get(name, name)
            if c['missing'] and c['points']:
                label += f' (<= {int(max(xs))} px)'
            label += f': k = {k:.2f}' if k is not None else ''
            ax.plot(xs, ys, label=label, linewidth=1.8, markersize=5,
                    **STYLES.get(name, {}))
        ax.set_xscale('log')
        ax.set_yscale('log')
        ax.set_xticks(sides)
        ax.set_xticklabels([str(int(round(s))) for s in sides])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel('input side (pixels, square input)')
        ax.grid(True, which='both', alpha=0.3)
        ax.legend(fontsize=8.5, loc='upper center', ncol=2,
                  bbox_to_anchor=(0.5, -0.13), title=f'cost ~ pixels^k '
                  f'(fit: side >= {int(fit_from)})', title_fontsize=8.5)
    axes[0].set_ylabel('forward latency (s, best of runs)')
    axes[0].set_title('Latency')
    axes[1].set_ylabel('peak forward memory (MB above the model)')
    axes[1].set_title('Peak memory')
    meta = next((r for r in results if 'threads' in r), {})
    threads = meta.get('threads', '?')
    fig.suptitle(f'Backbones, batch {meta.get("batch", 1)}, CPU, {threads} '
                 f'thread{"" if threads == 1 else "s"} '
                 '(tools/analysis/benchmark.py)', fontsize=11)
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return exps


def _new_file(text: str) -> str:
    """A file to write: checked when the command line is read (a folder
    used to fail only after the plot was drawn)."""
    if not text.strip() or osp.isdir(text):
        raise argparse.ArgumentTypeError(
            f'{text!r} is {"a directory" if text.strip() else "empty"}; '
            'give a file name')
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('results', help='JSON written by benchmark.py --out')
    parser.add_argument('--out', required=True, type=_new_file,
                        help='PNG to write')
    parser.add_argument('--fit-from', type=float, default=384,
                        help='smallest input side in the exponent fit')
    args = parser.parse_args(argv)
    if not (math.isfinite(args.fit_from) and args.fit_from > 0):
        parser.error(f'argument --fit-from: must be a finite number > 0, '
                     f'got {args.fit_from!r}')
    with open(args.results) as f:
        results = json.load(f)
    exps = plot(results, args.out, args.fit_from)
    for name, e in exps.items():
        print(f'{name:16s} ' + '  '.join(
            f'{k} exponent {v:.2f}' if v is not None else f'{k} -'
            for k, v in e.items()))
    print(f'wrote {args.out}')


if __name__ == '__main__':
    main()

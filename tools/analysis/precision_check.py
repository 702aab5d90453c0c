"""How much the fused clustering's opt-in 'tf32x3' precision changes ClusTR's
cluster ids, measured on the CPU by emulation:

    python tools/analysis/precision_check.py [--arch small] [--mode exact] \
        [--size 224] [--images 4] [--data data/imagenet] [--out r.json]

ClusTR (random weights, seed 0) runs a few images (the first ``--images``
JPEGs under ``--data``, resized to the input size and normalised like
ImageNet; random inputs if there are none) with the reference clustering.
Every clustering call of every block also runs

- with 3xTF32 distances emulated in torch (``dpc_knn_reference(...,
  emulate='tf32x3')``: tf32 hi/lo halves, round to nearest, the three
  products in fp32, the 'tf32x3' tie threshold), as the fused kernels
  compute them on a GPU in that precision;
- with the channels in reverse order: the same IEEE fp32 algorithm summing
  in another order, the round-off floor of fp32 itself.

Both are compared with the IEEE ids of the same call (same input tokens:
the model runs on the IEEE ids) and reported per stage as the % of token
ids that differ, over all clustered scales.
"""
import argparse
import json
import os.path as osp
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

# the cluster drawing tool's loader (same folder: on sys.path when run)
from visualize_clusters import (  # noqa: E402
    IMAGENET_MEAN, IMAGENET_STD, load_image)
from clustr_mm.engine.cli_args import existing_dir, new_file  # noqa: E402

DEFAULT_DATA = 'data/imagenet'


def load_images(folder, count, size):
    """(B, 3, size, size) normalised images, or random ones (and a note)
    if ``folder`` holds no JPEGs."""
    files = sorted(Path(folder).rglob('*.JPEG'))[:count] if folder else []
    if not files:
        return torch.randn(count, 3, size, size), 'random inputs'
    images = [load_image(str(f), (size, size), IMAGENET_MEAN, IMAGENET_STD)[1]
              for f in files]
    return torch.cat(images), f'{len(files)} images from {folder}'


def precision_check(arch='small', mode='exact', size=224, images=4,
                    data=None):
    """Per stage: tokens clustered, % ids changed by emulated 3xTF32 and by
    reordered fp32 summation (against IEEE fp32)."""
    from clustr_mm.models.backbones.clustr import ClusTR
    from clustr_mm.models.layers.dpc_knn import DPCKNN, use_plan
    from clustr_mm.ops.dpc_knn import TRACE_PLAN, reference as ref
    torch.manual_seed(0)
    model = ClusTR(arch, clustering_mode=mode).eval()
    use_plan(model, TRACE_PLAN)  # the reference backend
    x, source = load_images(data, images, size)
    stats = defaultdict(lambda: dict(ids=0, tf32x3=0, reordered=0, calls=0))
    stage = [None]
    for name, m in model.named_modules():
        if isinstance(m, DPCKNN):
            def enter(_, __, s=int(name.split('.')[1])):
                stage[0] = s
            m.register_forward_pre_hook(enter)
    reference = ref.dpc_knn_reference

    def compared(x, counts, k, windows):
        ids = reference(x, counts, k, windows)
        row = stats[stage[0]]
        row['calls'] += 1
        row['ids'] += ids.numel()
        other = reference(x, counts, k, windows, emulate='tf32x3')
        row['tf32x3'] += int((other != ids).sum())
        other = reference(x.flip(-1), counts, k, windows)
        row['reordered'] += int((other != ids).sum())
        return ids

    ref.dpc_knn_reference = compared
    try:
        with torch.no_grad():
            model(x)
    finally:
        ref.dpc_knn_reference = reference
    rows = [dict(stage=s + 1, calls=r['calls'], ids=r['ids'],
                 tf32x3_pct=100 * r['tf32x3'] / r['ids'],
                 fp32_reordered_pct=100 * r['reordered'] / r['ids'])
            for s, r in sorted(stats.items())]
    # what ran: the CPU, fp32 tokens, 3xTF32 emulated (not a GPU kernel)
    return dict(arch=arch, mode=mode, size=size, inputs=source,
                torch=torch.__version__, device='cpu', dtype='float32',
                tf32x3='emulated in torch', stages=rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--arch', default='small',
                        choices=('tiny', 'small', 'base'))
    parser.add_argument('--mode', default='exact',
                        choices=('exact', 'window'))
    parser.add_argument('--size', type=int, default=224)
    parser.add_argument('--images', type=int, default=4)
    parser.add_argument('--data', type=existing_dir,
                        help='a folder searched for *.JPEG (random inputs '
                        'if it has none; default: data/imagenet where it '
                        'exists, else random inputs)')
    parser.add_argument('--out', type=new_file,
                        help='write the results as JSON here')
    args = parser.parse_args(argv)
    if args.size < 32 or args.images < 1:
        parser.error(f'--size must be >= 32 and --images >= 1, got '
                     f'{args.size} and {args.images}')
    if args.data is None and osp.isdir(DEFAULT_DATA):
        args.data = DEFAULT_DATA
    result = precision_check(args.arch, args.mode, args.size, args.images,
                             args.data)
    print(f"ClusTR-{args.arch} {args.mode} {args.size}, {result['inputs']}, "
          f"torch {result['torch']}")
    print('stage  calls      ids  tf32x3 %  fp32 reordered %')
    for r in result['stages']:
        print(f"{r['stage']:5d} {r['calls']:6d} {r['ids']:8d} "
              f"{r['tf32x3_pct']:9.3f} {r['fp32_reordered_pct']:17.3f}")
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == '__main__':
    main()

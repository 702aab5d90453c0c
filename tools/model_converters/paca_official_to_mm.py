"""Convert an official PaCa-ViT checkpoint into a clustr_mm checkpoint.

Sources: the timm ImageNet releases (raw state dicts, with the 1000-class
head) and the official mmdet / mmseg checkpoints (``state_dict`` with
``backbone.`` keys). The result uses mmpretrain's ImageClassifier layout,
``{'state_dict': {'backbone.*', 'head.fc.*'}, 'meta': {...}}``; downstream
configs load it with ``init_cfg=dict(type='Pretrained', checkpoint=...,
prefix='backbone.')``.

    python tools/model_converters/paca_official_to_mm.py SRC DST

The architecture is read off the weights (head counts are assumed to be the
official 2, 4, 8, 16); a model is built from it and the converted keys are
checked against it: matched / missing / unexpected / mismatched keys are
printed and the script fails unless everything matches.
"""
import argparse
import os
import sys
from collections import Counter

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))
from clustr_mm.models.backbones.paca import PaCaViT  # noqa: E402
from clustr_mm.checkpoints import (  # noqa: E402
    compare_state_dicts, convert_paca_official, infer_paca_config,
    read_checkpoint)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='official checkpoint (.pth)')
    parser.add_argument('dst', help='output clustr_mm checkpoint (.pth)')
    parser.add_argument(
        '--num-heads', type=int, nargs=4, default=None,
        help='heads per stage if not the official 2 4 8 16')
    return parser.parse_args(argv)


def _print_keys(title, keys, limit=20):
    print(f'{title}: {len(keys)}')
    for key in keys[:limit]:
        print(f'    {key}')
    if len(keys) > limit:
        print(f'    ... {len(keys) - limit} more')


def main(argv=None) -> int:
    args = parse_args(argv)
    converted, skipped = convert_paca_official(read_checkpoint(args.src))
    head = {k: converted.pop(k) for k in list(converted)
            if k.startswith('head.')}
    if not converted:
        print(f'error: no PaCa-ViT backbone keys found in {args.src}',
              file=sys.stderr)
        return 1
    config = infer_paca_config(converted)
    if args.num_heads:
        config['arch']['num_heads'] = args.num_heads
    model = PaCaViT(**config)
    report = compare_state_dicts(converted, model.state_dict())

    print(f'model: PaCaViT({config})')
    print(f'matched: {len(report["matched"])}')
    _print_keys('missing (in model, not in checkpoint)', report['missing'])
    _print_keys('unexpected (converted, not in model)', report['unexpected'])
    _print_keys('mismatched shapes', report['shape_mismatch'])
    groups = Counter(k.split('.')[0] for k in skipped)
    print(f'not converted (source keys outside the backbone or unknown): '
          f'{len(skipped)} ' + ', '.join(f'{g}.*: {n}'
                                         for g, n in groups.items()))
    print(f'classification head: {"yes" if head else "no"}')
    if report['missing'] or report['unexpected'] or report['shape_mismatch']:
        print('error: the converted weights do not fit the inferred model',
              file=sys.stderr)
        return 1

    state = {f'backbone.{k}': v for k, v in converted.items()}
    state.update(head)
    meta = dict(
        converted_from=os.path.basename(args.src),
        converter='tools/model_converters/paca_official_to_mm.py',
        backbone=dict(type='PaCaViT', **config))
    os.makedirs(os.path.dirname(os.path.abspath(args.dst)), exist_ok=True)
    torch.save(dict(state_dict=state, meta=meta), args.dst)
    print(f'saved {len(state)} tensors to {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

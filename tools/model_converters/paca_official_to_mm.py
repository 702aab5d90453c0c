"""Convert an official PaCa-ViT checkpoint into a clustr_mm checkpoint.

Not needed to use the release files: configs, ``load_from``,
``tools/test.py`` and the Inferencers convert them on load, with the same
table (``clustr_mm/checkpoints/paca_official.py``). This writes the
converted file once, e.g. for a machine without the release URL.

Sources: the timm ImageNet releases (raw state dicts, with the 1000-class
head, possibly with training-script entries) and the official mmdet / mmseg
checkpoints (``state_dict`` with ``backbone.`` keys). The result is our model
layout, ``{'state_dict': {'backbone.*', ...}, 'meta': {...}}``: a classifier's
head as ``head.fc.*``, a detector's / segmentor's neck and heads as they are.

    python tools/model_converters/paca_official_to_mm.py SRC DST

The backbone's architecture is read off the weights (head counts are assumed
to be the official 2, 4, 8, 16); a backbone is built from it and the
converted keys are checked against it: matched / missing / unexpected /
mismatched keys are printed and the script fails unless everything matches.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', '..'))
from clustr_mm.models.backbones.paca import PaCaViT  # noqa: E402
from clustr_mm.checkpoints import (  # noqa: E402
    compare_state_dicts, infer_paca_config, load_checkpoint_file)
from clustr_mm.checkpoints.paca_official import (  # noqa: E402
    SIGNATURE, release_variant)
from clustr_mm.engine.cli_args import new_file, positive_int  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('src', help='official checkpoint (.pth)')
    # checked before the conversion: a folder used to fail after it, with
    # torch's C++ message and no path
    parser.add_argument('dst', type=new_file,
                        help='output clustr_mm checkpoint (.pth)')
    parser.add_argument(
        '--num-heads', type=positive_int, nargs=4, default=None,
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
    try:
        checkpoint = load_checkpoint_file(args.src, 'cpu')
    except (OSError, ValueError, TypeError, RuntimeError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    if not isinstance(meta, dict) or 'converted_from' not in meta:
        print(f'error: {args.src} is not an official PaCa-ViT checkpoint: '
              f'expected the keys {list(SIGNATURE)} (timm classifier) or the '
              'same under backbone. (mmdet / mmseg)', file=sys.stderr)
        return 1
    state = checkpoint['state_dict']
    backbone = {k[len('backbone.'):]: v for k, v in state.items()
                if k.startswith('backbone.')}
    config = infer_paca_config(state)
    if args.num_heads:
        config['arch']['num_heads'] = args.num_heads
    model = PaCaViT(**config)
    report = compare_state_dicts(backbone, model.state_dict())

    print(f'source: {meta["converted_from"]["layout"]}')
    print(f'model: PaCaViT({config})')
    variant = release_variant(config)
    if variant is not None:
        print(f'the release names this model {variant!r}')
    print(f'matched: {len(report["matched"])}')
    _print_keys('missing (in model, not in checkpoint)', report['missing'])
    _print_keys('unexpected (converted, not in model)', report['unexpected'])
    _print_keys('mismatched shapes', report['shape_mismatch'])
    others = sorted({k.split('.')[0] for k in state
                     if not k.startswith('backbone.')})
    print(f'kept outside the backbone: {", ".join(others) or "nothing"}')
    if report['missing'] or report['unexpected'] or report['shape_mismatch']:
        print('error: the converted weights do not fit the inferred model',
              file=sys.stderr)
        return 1

    meta.update(
        converted_from=dict(meta['converted_from'],
                            source=os.path.basename(args.src)),
        converter='tools/model_converters/paca_official_to_mm.py',
        backbone=dict(type='PaCaViT', **config))
    os.makedirs(os.path.dirname(os.path.abspath(args.dst)), exist_ok=True)
    torch.save(dict(state_dict=state, meta=meta), args.dst)
    print(f'saved {len(state)} tensors to {args.dst}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

"""Convert an official ClusTR checkpoint into a clustr_mm checkpoint.

The output, ``{'state_dict': {'backbone.*', 'head.fc.*'}, 'meta': ...}``, loads
into mmpretrain's ``ImageClassifier`` (ClusTR backbone, GlobalAveragePooling
neck, LinearClsHead) and into downstream configs through
``init_cfg=dict(type='Pretrained', checkpoint=..., prefix='backbone.')``.

Example::

    python tools/model_converters/clustr_official_to_mm.py \
        clustr_small_official.pth work_dirs/clustr-s_in1k.pth
"""
import argparse
import os
import os.path as osp
import sys

import torch

sys.path.insert(0, osp.join(osp.dirname(__file__), '..', '..'))
from clustr_mm.engine.cli_args import new_file  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('src', help='official checkpoint ({"model": ...} or '
                        'a raw state dict)')
    # checked before the conversion: a folder used to fail after it, with
    # torch's C++ message and no path
    parser.add_argument('dst', type=new_file, help='output file')
    parser.add_argument('--arch', choices=['tiny', 'small', 'base'],
                        help='ClusTR arch (default: inferred from weights)')
    parser.add_argument('--force', action='store_true',
                        help='write the output even if keys are missing or '
                        'shapes mismatch')
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from clustr_mm.models.backbones.clustr import ClusTR
    from clustr_mm.checkpoints import (compare_state_dicts,
                                       infer_clustr_config,
                                       load_checkpoint_file)

    # the loader's one conversion path (the one load_from and init_cfg
    # take); weights-only: a downloaded checkpoint must not run code
    try:
        checkpoint = load_checkpoint_file(args.src, map_location='cpu')
    except (OSError, ValueError, TypeError, RuntimeError) as e:
        sys.exit(f'error: {e}')
    if not isinstance(checkpoint, dict):
        sys.exit(f'error: {args.src} holds a {type(checkpoint).__name__}, '
                 'expected a state dict')
    source = (checkpoint.get('meta') or {}).get('converted_from', {})
    layout = source.get('layout', '')
    paca = 'official PaCa-ViT '
    if layout.startswith(paca):
        sys.exit(f'error: {args.src} is an official PaCa-ViT checkpoint '
                 f'({layout[len(paca):]} layout), not a ClusTR one: convert '
                 'it with '
                 'tools/model_converters/paca_official_to_mm.py, or load it '
                 'as it is (clustr_mm converts official PaCa-ViT files on '
                 'load)')
    state = checkpoint.get('state_dict', checkpoint)
    if not layout:
        ours = [k for k in state if k.startswith(('backbone.stages.',
                                                  'stages.'))]
        if ours:
            sys.exit(f'error: {args.src} is already a clustr_mm checkpoint '
                     f'(keys like {ours[0]}); use it directly (load_from, '
                     "init_cfg=dict(type='Pretrained', checkpoint=..., "
                     "prefix='backbone.')), there is nothing to convert")
        sys.exit(f'error: no official ClusTR keys in {args.src}: expected '
                 'patch_embed1.*, block1.0.*, norm1.*, head.*; found '
                 f'{list(state)[:5]}')
    converted = state
    arch = args.arch or infer_clustr_config(converted)['arch']

    backbone = ClusTR(arch)
    expected = {f'backbone.{k}': v for k, v in backbone.state_dict().items()}
    head_w = converted.get('head.fc.weight')
    if head_w is not None:
        expected['head.fc.weight'] = torch.empty(head_w.shape[0],
                                                 backbone.embed_dims[-1])
        expected['head.fc.bias'] = torch.empty(head_w.shape[0])
    report = compare_state_dicts(converted, expected)

    print(f'arch: {arch}')
    for name in ('matched', 'missing', 'unexpected', 'shape_mismatch'):
        keys = report[name]
        print(f'{name}: {len(keys)}')
        if name != 'matched':
            for key in keys:
                print(f'  {key}')
    if (report['missing'] or report['shape_mismatch']) and not args.force:
        sys.exit('error: missing or shape-mismatched keys; nothing written '
                 '(use --force to write anyway)')

    state_dict = {k: converted[k].contiguous() for k in report['matched']}
    meta = dict(source=osp.abspath(args.src), arch=arch,
                converted_from=source,
                converter='tools/model_converters/clustr_official_to_mm.py')
    os.makedirs(osp.dirname(osp.abspath(args.dst)), exist_ok=True)
    torch.save(dict(state_dict=state_dict, meta=meta), args.dst)
    print(f'saved {len(state_dict)} tensors to {args.dst}')


if __name__ == '__main__':
    main()

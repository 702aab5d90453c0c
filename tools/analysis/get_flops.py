"""Parameters and FLOPs of any clustr_mm config (mmpretrain, mmdet, mmseg,
mmpose), with attention and clustering counted.

    python tools/analysis/get_flops.py CONFIG [CHECKPOINT] [--shape H W]
        [--json OUT] [--cfg-options k=v ...]

CHECKPOINT (optional, the mm tools' order): a runner checkpoint of the whole
model (``tools/train.py`` output) or backbone-only weights. The counts do not
depend on the weights (fixed shapes, analytic clustering count, fixed
proposals); the checkpoint is loaded so that a mismatch with the config is
caught and the report names the weights it describes.

Counting: one multiply-add = one FLOP, via ``mmengine.analysis.FlopAnalyzer``
plus our handles for ``scaled_dot_product_attention`` and fused multi-head
attention, and an explicit analytic count of the DPC-kNN clustering (see
``clustr_mm/analysis/flops.py`` for every term). Batch 1, eval mode, no
data preprocessing (normalisation and padding cost nothing here).

What runs, per library (the tensor path, like the libraries' own get_flops):

- mmpretrain: backbone, neck and head (``mode='tensor'``), no softmax.
- mmseg: backbone, neck and decode head (``mode='tensor'``); the auxiliary
  head is training-only and not counted.
- mmpose: backbone, neck and head (``mode='tensor'``); no flip test.
- mmdet one-stage: backbone, neck and the dense head's convolutions.
- mmdet two-stage: backbone, neck, the RPN head's convolutions and the RoI
  head on ``test_cfg.rpn.max_per_img`` proposals (1000 for Mask R-CNN), the
  first 100 of which go to the mask head (mmdet's ``roi_head.forward``
  convention). Proposal decoding, NMS and RoIAlign are not multiply-adds
  and are not counted; fixed proposals make the count independent of the
  image.

Default input (H W): 224 224 (mmpretrain; a test-pipeline CenterCrop size if
the config has one), 800 1280 (mmdet, padded to the config's size divisor),
the data preprocessor's ``size`` or 512 512 (mmseg), the codec's input size
or 256 192 (mmpose).
"""
import argparse
import json
import math
import os
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

import torch  # noqa: E402
from mmengine.config import Config, DictAction  # noqa: E402

import clustr_mm  # noqa: E402,F401  (registers the backbones)
from clustr_mm.analysis.flops import FlopReport, analyze_flops  # noqa: E402
from clustr_mm.engine.cli_args import new_file, positive_int  # noqa: E402
from clustr_mm.engine.options import merge_cfg_options  # noqa: E402
from clustr_mm.engine.launch import SCOPES, build_in_scope  # noqa: E402

PART_LABELS = {
    'backbone/embedding': 'backbone: patch embedding / stem / downsampling',
    'backbone/attention projections': 'backbone: attention projections',
    'backbone/attention products': 'backbone: attention q.k^T and a.v',
    'backbone/clustering': 'backbone: clustering',
    'backbone/mlp': 'backbone: MLP',
    'backbone/other': 'backbone: norms and other',
    'neck': 'neck',
    'heads': 'heads',
    'other': 'other',
}


def build_model(cfg: Config) -> torch.nn.Module:
    """Build ``cfg.model`` with the registry of the config's library."""
    scope = cfg.get('default_scope', 'mmdet')
    if scope not in SCOPES:
        raise ValueError(f'default_scope must be one of {SCOPES}, got '
                         f'{scope!r}')
    return build_in_scope(cfg.model, scope)


def load_weights(model: torch.nn.Module, checkpoint: str) -> dict:
    """Load ``checkpoint`` into ``model`` (whole model, or its backbone when
    the file holds backbone weights only). Returns what was loaded.

    Reads without unpickling objects; raises when no tensor fits the model,
    warns about missing, unused or re-initialised (shape-changed) ones.
    """
    from clustr_mm.checkpoints import load_backbone_state, read_checkpoint
    state = read_checkpoint(checkpoint)
    whole = any(k.startswith('backbone.') for k in state)
    backbone = getattr(model, 'backbone', None)
    target = model if whole or backbone is None else backbone
    report = load_backbone_state(target, state)
    return dict(path=checkpoint,
                into='model' if target is model else 'backbone',
                loaded=len(report['loaded']),
                tensors=len(target.state_dict()),
                reinitialized=report['reinitialized'])


def _find_crop(pipeline):
    for step in pipeline or ():
        if step.get('type') == 'CenterCrop':
            size = step.get('crop_size')
            return (size, size) if isinstance(size, int) else tuple(size)
    return None


def default_shape(cfg: Config):
    """(H, W) of the library's standard input for this config."""
    scope = cfg.get('default_scope')
    if scope == 'mmpretrain':
        pipeline = cfg.get('test_pipeline') or cfg.get(
            'test_dataloader', {}).get('dataset', {}).get('pipeline')
        return _find_crop(pipeline) or (224, 224)
    if scope == 'mmseg':
        size = cfg.model.get('data_preprocessor', {}).get('size')
        return tuple(size) if size else (512, 512)
    if scope == 'mmpose':
        size = cfg.get('codec', {}).get('input_size')
        return (size[1], size[0]) if size else (256, 192)
    return (800, 1280)


def counted_path(model, scope: str, shape):
    """(inputs, forward, description) of the path to count."""
    h, w = shape
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1, 3, h, w, generator=gen)
    tensor_forward = model.forward

    if scope == 'mmdet' and getattr(model, 'with_rpn', False) and hasattr(
            model, 'roi_head'):
        from mmdet.structures import DetDataSample
        from mmengine.structures import InstanceData
        num = model.test_cfg['rpn']['max_per_img']
        xy = torch.rand(num, 2, generator=gen) * torch.tensor([w, h]) * 0.75
        wh = 16 + torch.rand(num, 2, generator=gen) * torch.tensor(
            [w, h]) * 0.25
        proposals = InstanceData(bboxes=torch.cat([xy, xy + wh], 1))
        sample = DetDataSample(metainfo=dict(
            img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w),
            batch_input_shape=(h, w), scale_factor=(1.0, 1.0)))

        def forward(inputs):
            feats = model.extract_feat(inputs)
            return (model.rpn_head(feats),
                    model.roi_head.forward(feats, [proposals], [sample]))

        what = (f'backbone + neck + RPN head convs + RoI head on {num} '
                f'proposals (mask head on the first 100)')
        return x, forward, what

    if scope == 'mmseg' and isinstance(getattr(model, 'decode_head', None),
                                       torch.nn.Module) and not isinstance(
                                           model.decode_head,
                                           torch.nn.ModuleList):
        # mmseg's tensor path calls decode_head.forward() directly, which
        # leaves the head's own ops (e.g. PaCaSegHead's matmuls) outside its
        # module scope; calling the module books them under 'heads'.
        def forward(inputs):
            return model.decode_head(model.extract_feat(inputs))

        return x, forward, ('backbone + neck + decode head (no auxiliary '
                            'head)')

    def forward(inputs):
        return tensor_forward(inputs, None, mode='tensor')

    what = {
        'mmpretrain': 'backbone + neck + head',
        'mmseg': 'backbone + neck + decode head (no auxiliary head)',
        'mmpose': 'backbone + neck + head (no flip test)',
        'mmdet': 'backbone + neck + dense head convs',
    }[scope]
    return x, forward, what


def get_flops(config: str, shape=None, cfg_options=None,
              checkpoint=None) -> dict:
    """Params and FLOPs of ``config`` (with ``checkpoint``'s weights if
    given); returns a JSON-friendly dict."""
    cfg = Config.fromfile(config)
    if cfg_options:
        merge_cfg_options(cfg, cfg_options, config)
    if not isinstance(cfg.get('model'), dict):
        raise ValueError(f'{cfg.filename}: the config has no model = dict('
                         '...) (a dataset, schedule or runtime piece?); '
                         'give a config of a whole model')
    scope = cfg.get('default_scope', 'mmdet')
    shape = tuple(shape) if shape else default_shape(cfg)
    if scope == 'mmdet':
        div = cfg.model.get('data_preprocessor', {}).get('pad_size_divisor',
                                                         1) or 1
        shape = tuple(int(math.ceil(s / div) * div) for s in shape)
    # Pretrained weights (init_cfg) are irrelevant to the count: not loaded.
    model = build_model(cfg).eval()
    weights = load_weights(model, checkpoint) if checkpoint else None
    params = sum(p.numel() for p in model.parameters())
    backbone = getattr(model, 'backbone', None)
    backbone_params = (sum(p.numel() for p in backbone.parameters())
                       if backbone is not None else params)
    inputs, forward, what = counted_path(model, scope, shape)
    report: FlopReport = analyze_flops(model, inputs, forward)
    return dict(
        config=config, checkpoint=weights, scope=scope,
        input=[1, 3, *shape], counted=what,
        params=params, backbone_params=backbone_params,
        flops=report.total,
        flops_without_attention_and_clustering=(
            report.without_attention_and_clustering),
        by_part=dict(report.by_part),
        by_operator=dict(report.by_operator.most_common()),
        uncounted_ops=sorted(op.replace('aten::', '')
                             for op in report.uncounted_ops))


def _fmt(value: int) -> str:
    return (f'{value / 1e9:9.3f} G' if value >= 1e7 else
            f'{value / 1e6:9.3f} M')


def format_result(r: dict) -> str:
    g = 1e9
    lines = [
        f'config:  {r["config"]} ({r["scope"]})',
        'weights: ' + (f'{w["path"]} ({w["loaded"]} of {w["tensors"]} '
                       f'{w["into"]} tensors loaded)'
                       if (w := r.get('checkpoint')) else
                       'none (random initialisation; counts do not depend '
                       'on weights)'),
        f'input:   {"x".join(map(str, r["input"]))}',
        f'counted: {r["counted"]}',
        f'params:  {r["params"] / 1e6:.2f} M (backbone '
        f'{r["backbone_params"] / 1e6:.2f} M)',
        f'FLOPs:   {r["flops"] / g:.2f} G (1 FLOP = 1 multiply-add)',
        f'         {r["flops_without_attention_and_clustering"] / g:.2f} G '
        'without attention products and clustering (the ClusTR paper\'s '
        'convention)',
        'breakdown:',
    ]
    total = r['flops'] or 1
    for key, value in r['by_part'].items():
        lines.append(f'  {PART_LABELS.get(key, key):50s} {_fmt(value)} '
                     f'{100 * value / total:5.1f}%')
    lines.append('by operator:')
    for op, value in r['by_operator'].items():
        lines.append(f'  {op:50s} {_fmt(value)}')
    if r['uncounted_ops']:
        lines.append('not counted (no multiply-adds, by convention): ' +
                     ', '.join(r['uncounted_ops']))
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config')
    parser.add_argument('checkpoint', nargs='?',
                        help='weights to load (whole model or backbone); '
                        'optional, the counts do not depend on them')
    parser.add_argument('--shape', type=positive_int, nargs='+', metavar='N',
                        help='input H W (one value: square); default: the '
                        "library's standard input")
    parser.add_argument('--json', type=new_file,
                        help='also write the result as JSON here')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, key=value')
    args = parser.parse_args(argv)
    shape = args.shape
    if shape is not None:
        if len(shape) not in (1, 2):
            parser.error('--shape takes H W or one size')
        shape = shape * 2 if len(shape) == 1 else shape
    torch.set_num_threads(int(os.environ.get('OMP_NUM_THREADS', 2)))
    result = get_flops(args.config, shape, args.cfg_options, args.checkpoint)
    print(format_result(result))
    if args.json:
        os.makedirs(osp.dirname(osp.abspath(args.json)), exist_ok=True)
        with open(args.json, 'w') as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == '__main__':
    main()

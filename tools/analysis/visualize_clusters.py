"""Show which pixels went to which cluster, for chosen stages and blocks.

    python tools/analysis/visualize_clusters.py CONFIG [CHECKPOINT] \
        --image IMAGE --out clusters.png [--stages 0 1 2] [--blocks 0] \
        [--shape H W] [--num-heatmaps 6] [--tile 224] [--cfg-options k=v ...]

CONFIG [CHECKPOINT] come first as in the mm tools; the checkpoint is a
runner checkpoint of the whole model (``tools/train.py`` output) or
backbone-only weights. The older order ``IMAGE CONFIG [CHECKPOINT]`` (no
``--image``) still works.

One row per (stage, block) whose attention uses clusters, the input image on
the left and, to its right:

- hard assignments (ClusTR's DPC-kNN, and other hard reducers): one tile per
  scale, every cluster painted in its own flat colour (the same cluster id
  always gets the same colour within a tile, different ids different
  colours), so a cluster's members are the pixels of one colour;
- soft assignments (PaCa-ViT): a tile with each pixel's most likely cluster
  (flat colours, as above), then heat maps of the ``--num-heatmaps`` most
  concentrated clusters (highest peak weight), each in the 'inferno' colour
  map scaled from the cluster's smallest weight (black) to its largest
  (yellow); the panel title gives the largest weight (a softmax over the
  N tokens, so 1/N is uniform).

Each token of a stage's grid covers a square of the tile (nearest-neighbour
upsampling, no smoothing), so the picture shows the clustering at the
resolution it happens. Works for any config whose backbone is ClusTR or
PaCaViT (classifier, detector, segmentor or pose model alike); without a
checkpoint the weights are random (the clusters then follow raw colours and
edges). Only the backbone runs.
"""
import argparse
import colorsys
import os
import os.path as osp
import sys
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))

IMAGENET_MEAN = (123.675, 116.28, 103.53)
IMAGENET_STD = (58.395, 57.12, 57.375)
UNASSIGNED = (40, 40, 40)  # colour of tokens a reducer left out (id -1)


# --------------------------------------------------------------------------
# Colours


def cluster_palette(n: int) -> np.ndarray:
    """(n, 3) uint8 colours, pairwise distinct, neighbouring ids far apart.

    Hues step by the golden angle; saturation and value cycle through a few
    levels so that even a few thousand clusters get distinct colours.
    """
    levels = [(0.85, 0.95), (0.55, 0.85), (0.95, 0.65), (0.4, 0.98),
              (0.75, 0.5)]
    colours, seen = [], {tuple(UNASSIGNED)}
    i = 0
    while len(colours) < n:
        s, v = levels[(i // 7) % len(levels)]
        hue = (i * 0.6180339887498949) % 1.0
        rgb = tuple(
            int(round(255 * c)) for c in colorsys.hsv_to_rgb(hue, s, v))
        i += 1
        if rgb in seen:
            continue
        seen.add(rgb)
        colours.append(rgb)
    return np.array(colours, dtype=np.uint8).reshape(n, 3)


def colorize_ids(ids: np.ndarray) -> np.ndarray:
    """(H, W) cluster ids (-1: unassigned) -> (H, W, 3) uint8 flat colours."""
    ids = np.asarray(ids)
    palette = cluster_palette(int(ids.max()) + 1 if ids.size else 0)
    out = np.empty(ids.shape + (3, ), dtype=np.uint8)
    out[...] = UNASSIGNED
    valid = ids >= 0
    out[valid] = palette[ids[valid]]
    return out


def heatmap(values: np.ndarray) -> np.ndarray:
    """(H, W) weights -> (H, W, 3) uint8 'inferno' colours, min-max scaled.

    The lowest weight of the map is black, the highest yellow; a brighter
    pixel always has a larger weight than a darker one.
    """
    from matplotlib import colormaps
    values = np.asarray(values, dtype=np.float64)
    low, high = values.min(), values.max()
    scaled = ((values - low) / (high - low) if high > low else
              np.zeros_like(values))
    lut = (colormaps['inferno'](np.linspace(0, 1, 256))[:, :3] * 255).round()
    idx = np.clip((scaled * 255).round().astype(int), 0, 255)
    return lut.astype(np.uint8)[idx]


# --------------------------------------------------------------------------
# Model and image


def build_model(config: str, checkpoint: Optional[str] = None,
                cfg_options: Optional[dict] = None):
    """(model, cfg): the config's model, built by its library's registry."""
    from mmengine.config import Config

    import clustr_mm  # noqa: F401
    from clustr_mm.checkpoints import load_backbone_state, read_checkpoint
    from clustr_mm.engine.launch import build_in_scope
    from clustr_mm.engine.options import merge_cfg_options
    cfg = Config.fromfile(config)
    if cfg_options:
        merge_cfg_options(cfg, cfg_options, config)
    scope = cfg.get('default_scope', 'mmdet')
    model = build_in_scope(cfg.model, scope)
    if checkpoint:
        state = read_checkpoint(checkpoint)
        whole = any(k.startswith('backbone.') for k in state)
        load_backbone_state(model if whole else model.backbone, state)
    return model.eval(), cfg


def normalisation(cfg) -> Tuple[Sequence[float], Sequence[float]]:
    pre = cfg.model.get('data_preprocessor') or cfg.get(
        'data_preprocessor') or {}
    return (pre.get('mean') or IMAGENET_MEAN, pre.get('std') or IMAGENET_STD)


def load_image(path: str, shape: Tuple[int, int], mean, std
               ) -> Tuple[Image.Image, torch.Tensor]:
    """(RGB image resized to ``shape`` = (H, W), (1, 3, H, W) model input)."""
    image = Image.open(path).convert('RGB').resize(
        (shape[1], shape[0]), Image.BILINEAR)
    x = torch.from_numpy(np.asarray(image, dtype=np.float32).copy())
    x = (x - torch.tensor(mean, dtype=torch.float32)) / torch.tensor(
        std, dtype=torch.float32)
    return image, x.permute(2, 0, 1)[None]


# --------------------------------------------------------------------------
# Collecting assignments


def collect_assignments(backbone: torch.nn.Module, x: torch.Tensor,
                        stages: Optional[Sequence[int]] = None,
                        blocks: Sequence[int] = (0, )) -> List[dict]:
    """Run ``backbone(x)`` and return the chosen blocks' assignments (as the
    backbone keeps them with ``keep_assignments``).

    Returns one dict per (stage, block) that clusters, in order:
    ``stage``, ``block`` (0-based), ``hw`` (the token grid) and ``maps`` (one
    per scale: (H, W) long cluster ids, or (M, H, W) soft weights).
    """
    num = len(backbone.stages)
    for s in stages or ():
        if not -num <= s < num:
            raise ValueError(f'--stages {s}: the backbone has {num} stages '
                             f'(0..{num - 1}, or -{num}..-1 from the end)')
    stages = range(num) if stages is None else [s % num for s in stages]
    for si in stages:
        depth = len(backbone.stages[si].blocks)
        for b in blocks:
            if not -depth <= b < depth:
                raise ValueError(
                    f'--blocks {b}: stage {si} has {depth} blocks '
                    f'(0..{depth - 1}, or -{depth}..-1 from the end)')
    previous = backbone.keep_assignments
    backbone.keep_assignments = True
    try:
        with torch.no_grad():
            backbone(x)
        kept = backbone.assignments
    finally:
        backbone.keep_assignments = previous
    found = []
    for si in sorted(set(stages)):
        for bi in sorted({b % len(kept[si]) for b in blocks}):
            maps = [a[0].cpu().float() if a.is_floating_point() else
                    a[0].cpu().long() for a in kept[si][bi]]
            if maps:  # full attention has none
                found.append(dict(stage=si, block=bi,
                                  hw=tuple(maps[0].shape[-2:]), maps=maps))
    return found


# --------------------------------------------------------------------------
# Rendering


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def _upsample(pixels: np.ndarray, size: Tuple[int, int]) -> Image.Image:
    """Nearest-neighbour resize of an (h, w, 3) uint8 array to (W, H)."""
    return Image.fromarray(pixels).resize(size, Image.NEAREST)


def render(image: Image.Image, records: List[dict], tile: int = 224,
           num_heatmaps: int = 6, title: str = ''
           ) -> Tuple[Image.Image, List[dict]]:
    """Compose the figure.

    Returns the picture and its panels: dicts with ``kind`` ('image', 'hard'
    or 'soft'), ``box`` (x0, y0, x1, y1) in the picture, and for maps
    ``stage``, ``block``, ``hw``, ``data`` (the (H, W) ids or weights shown)
    and ``cluster`` (soft panels).
    """
    pad, head = 8, 20
    aspect = image.height / image.width
    tw, th = tile, max(1, int(round(tile * aspect)))
    font, small = _font(14), _font(12)

    rows = []
    for rec in records:
        panels = [dict(kind='image', label=f'stage {rec["stage"] + 1}, '
                       f'block {rec["block"] + 1}')]
        for s, m in enumerate(rec['maps']):
            scale = f'scale {s + 1}: ' if len(rec['maps']) > 1 else ''
            if m.dim() == 2:  # hard ids
                n = int(m.max()) + 1
                n_used = int(torch.unique(m[m >= 0]).numel())
                label = (f'{scale}{n_used} clusters'
                         if n_used < m.numel() else
                         f'{scale}{n} (every token)')
                panels.append(dict(kind='hard', data=m.numpy(), label=label,
                                   stage=rec['stage'], block=rec['block'],
                                   hw=rec['hw'], scale=s))
            else:  # soft (M, H, W)
                ids = m.argmax(0)
                panels.append(dict(kind='hard', data=ids.numpy(),
                                   label=f'{scale}argmax of {m.shape[0]}',
                                   stage=rec['stage'], block=rec['block'],
                                   hw=rec['hw'], scale=s))
                peaks = m.flatten(1).amax(1)
                top = peaks.argsort(descending=True)[:num_heatmaps]
                for c in sorted(top.tolist()):
                    panels.append(dict(
                        kind='soft', data=m[c].numpy(), cluster=c,
                        label=f'cluster {c} (max {float(peaks[c]):.2g})',
                        stage=rec['stage'], block=rec['block'],
                        hw=rec['hw'], scale=s))
        rows.append(panels)

    cols = max((len(r) for r in rows), default=1)
    top = head + pad if title else 0
    width = pad + cols * (tw + pad)
    height = top + pad + max(len(rows), 1) * (th + head + pad)
    canvas = Image.new('RGB', (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    if title:
        draw.text((pad, pad), title, fill=(0, 0, 0), font=font)
    shown = image.resize((tw, th), Image.BILINEAR)
    placed = []
    for r, panels in enumerate(rows):
        y = top + pad + r * (th + head + pad)
        for c, panel in enumerate(panels):
            x = pad + c * (tw + pad)
            draw.text((x, y), panel['label'], fill=(0, 0, 0),
                      font=font if c == 0 else small)
            box = (x, y + head, x + tw, y + head + th)
            if panel['kind'] == 'image':
                canvas.paste(shown, box[:2])
            elif panel['kind'] == 'hard':
                canvas.paste(_upsample(colorize_ids(panel['data']),
                                       (tw, th)), box[:2])
            else:
                canvas.paste(_upsample(heatmap(panel['data']), (tw, th)),
                             box[:2])
            panel = dict(panel, box=box)
            panel.pop('label')
            placed.append(panel)
    return canvas, placed


CONFIG_SUFFIXES = ('.py', '.json', '.yaml', '.yml')


def parse_args(argv=None) -> argparse.Namespace:
    """Arguments, with ``config``, ``checkpoint`` and ``image`` resolved from
    either order: ``CONFIG [CHECKPOINT] --image IMAGE`` (mm tools) or
    ``IMAGE CONFIG [CHECKPOINT]``."""
    from mmengine.config import DictAction

    from clustr_mm.engine.cli_args import (new_file, non_negative_int,
                                           positive_int)
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage='%(prog)s CONFIG [CHECKPOINT] --image IMAGE --out OUT '
        '[options]\n       %(prog)s IMAGE CONFIG [CHECKPOINT] --out OUT '
        '[options]')
    parser.add_argument('paths', nargs='+', metavar='PATH',
                        help='CONFIG [CHECKPOINT] (or IMAGE CONFIG '
                        '[CHECKPOINT]); the checkpoint holds the whole model '
                        'or its backbone; default: random initialisation')
    parser.add_argument('--image', help='the picture to cluster (required '
                        'when CONFIG comes first)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, key=value')
    parser.add_argument('--out', required=True, type=new_file,
                        help='PNG to write')
    parser.add_argument('--stages', type=non_negative_int, nargs='+',
                        help='0-based stages (default: every stage with '
                        'clusters)')
    parser.add_argument('--blocks', type=int, nargs='+', default=[0],
                        help='0-based blocks of each stage, negative from the '
                        'end (default: 0)')
    parser.add_argument('--shape', type=positive_int, nargs=2,
                        default=(224, 224),
                        metavar=('H', 'W'),
                        help='model input size (default: 224 224)')
    parser.add_argument('--num-heatmaps', type=non_negative_int, default=6,
                        help='soft clusters shown per block (default: 6)')
    parser.add_argument('--tile', type=positive_int, default=224,
                        help='panel width in pixels (default: 224)')
    args = parser.parse_args(argv)

    paths = args.paths
    if len(paths) > 3:
        parser.error(f'too many paths: {paths}')
    if paths[0].lower().endswith(CONFIG_SUFFIXES):  # CONFIG [CHECKPOINT]
        if len(paths) > 2:
            parser.error('CONFIG [CHECKPOINT] first: give the image with '
                         f'--image, not as a third path ({paths[2]})')
        if not args.image:
            parser.error('--image IMAGE is required when CONFIG comes first')
        args.config, args.checkpoint = paths[0], (paths[1:] or [None])[0]
    else:  # IMAGE CONFIG [CHECKPOINT]
        if args.image:
            parser.error(f'two images: {paths[0]} and --image {args.image}')
        if len(paths) < 2 or not paths[1].lower().endswith(CONFIG_SUFFIXES):
            parser.error('expected CONFIG [CHECKPOINT] --image IMAGE or '
                         f'IMAGE CONFIG [CHECKPOINT], got {paths}')
        args.image, args.config = paths[:2]
        args.checkpoint = (paths[2:] or [None])[0]
    for what in ('image', 'config', 'checkpoint'):
        path = getattr(args, what)
        if path and not osp.isfile(path) and not (
                what == 'checkpoint' and path.startswith(('http://',
                                                          'https://'))):
            parser.error(f'{what} not found: {path}')
    return args


def main(argv=None):
    args = parse_args(argv)

    torch.manual_seed(0)
    model, cfg = build_model(args.config, args.checkpoint, args.cfg_options)
    backbone = getattr(model, 'backbone', model)
    from mmengine.registry import MODELS
    if not isinstance(backbone, (MODELS.get('ClusTR'), MODELS.get('PaCaViT'))):
        raise SystemExit(f'{args.config}: the backbone is a '
                         f'{type(backbone).__name__}; clusters can be shown '
                         'for ClusTR and PaCaViT backbones only')
    mean, std = normalisation(cfg)
    image, x = load_image(args.image, tuple(args.shape), mean, std)
    try:
        records = collect_assignments(backbone, x, args.stages, args.blocks)
    except ValueError as err:
        raise SystemExit(str(err))
    if not records:
        raise SystemExit('no clustering attention in the chosen stages / '
                         'blocks (full attention only?)')
    weights = (osp.basename(args.checkpoint) if args.checkpoint else
               'random weights')
    title = (f'{type(backbone).__name__} ({osp.basename(args.config)}, '
             f'{weights}), input {args.shape[0]}x{args.shape[1]}')
    picture, panels = render(image, records, args.tile, args.num_heatmaps,
                             title)
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
    picture.save(args.out, optimize=True)
    print(f'wrote {args.out} ({picture.width}x{picture.height}, '
          f'{len(records)} rows)')
    return picture, panels, records


if __name__ == '__main__':
    main()

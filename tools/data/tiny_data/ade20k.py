"""ADE20K (``ADEChallengeData2016``): flat-coloured street scenes and
uint8 label maps."""
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from .common import (make_rng, new_canvas, add_noise, save_jpeg, save_png)


# ADE20K class index (0..149, as in mmseg's ADE20KDataset) -> RGB colour.
# The label maps store index + 1; 0 is 'other' and is ignored in training.
ADE_CLASSES = {
    1: (130, 130, 140),   # building
    2: (120, 180, 240),   # sky
    4: (30, 120, 40),     # tree
    6: (95, 85, 80),      # road
    12: (240, 200, 40),   # person
    20: (210, 30, 40),    # car
}
ADE_SPLITS = {'training': ('train', 16), 'validation': ('val', 8)}
ADE_SIZE = (192, 144)


def make_ade20k(root):
    """ADE20K scene parsing (``ADEChallengeData2016``) with uint8 label maps."""
    root = Path(root) / 'ade' / 'ADEChallengeData2016'
    width, height = ADE_SIZE
    files = []
    for split, (tag, num_images) in ADE_SPLITS.items():
        rng = make_rng('ade20k', split)
        for i in range(1, num_images + 1):
            img, draw = new_canvas(width, height, (0, 0, 0))
            label = Image.new('L', (width, height), 0)
            draw_label = ImageDraw.Draw(label)

            def paint(kind, coords, cls, colour=None):
                fill = ADE_CLASSES[cls] if colour is None else colour
                getattr(draw, kind)(coords, fill=fill)
                getattr(draw_label, kind)(coords, fill=0 if colour else cls + 1)

            horizon = int(rng.integers(int(0.35 * height), int(0.6 * height)))
            paint('rectangle', [0, 0, width, horizon], 2)            # sky
            paint('rectangle', [0, horizon, width, height], 6)       # road
            for _ in range(int(rng.integers(1, 3))):                 # buildings
                bw = int(rng.integers(30, 70))
                bx = int(rng.integers(0, width - bw))
                by = int(rng.integers(8, horizon - 10))
                paint('rectangle', [bx, by, bx + bw, horizon], 1)
            for _ in range(int(rng.integers(1, 3))):                 # trees
                tx = int(rng.integers(10, width - 10))
                tr = int(rng.integers(10, 20))
                paint('ellipse', [tx - tr, horizon - 2.2 * tr, tx + tr, horizon], 4)
            for _ in range(int(rng.integers(1, 3))):                 # cars
                cw = int(rng.integers(30, 56))
                cx = int(rng.integers(0, width - cw))
                cy = int(rng.integers(horizon + 4, height - 12))
                paint('rectangle', [cx, cy, cx + cw, min(height, cy + cw // 2)], 20)
            px = int(rng.integers(8, width - 8))                      # a person
            py = int(rng.integers(horizon - 10, height - 30))
            paint('ellipse', [px - 6, py, px + 6, py + 30], 12)
            ox, oy = int(rng.integers(0, width - 20)), int(rng.integers(0, height - 20))
            paint('polygon', [(ox, oy), (ox + 18, oy + 4), (ox + 14, oy + 18),  # 'other'
                              (ox + 2, oy + 14)], 0,
                  colour=tuple(int(c) for c in rng.integers(0, 256, size=3)))

            name = f'ADE_{tag}_{i:08d}'
            img_path = root / 'images' / split / f'{name}.jpg'
            seg_path = root / 'annotations' / split / f'{name}.png'
            save_jpeg(img_path, add_noise(img, rng, sigma=6.0))
            save_png(seg_path, np.asarray(label, dtype=np.uint8))
            files += [img_path, seg_path]
    return files

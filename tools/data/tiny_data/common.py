"""Helpers shared by the dataset generators: seeded randomness, shapes,
drawing and deterministic file writers."""
import hashlib
import json
import math

import numpy as np
from PIL import Image, ImageDraw


def make_rng(*key):
    """A generator seeded from a readable key, e.g. ``('coco', 'train')``."""
    digest = hashlib.sha256('/'.join(map(str, key)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], 'little'))


def new_canvas(width, height, colour):
    """A flat RGB image and its drawing handle."""
    img = Image.new('RGB', (width, height), tuple(int(c) for c in colour))
    return img, ImageDraw.Draw(img)


def add_noise(img, rng, sigma=5.0):
    """Add seeded Gaussian pixel noise; returns a uint8 HxWx3 array."""
    arr = np.asarray(img, dtype=np.float32)
    arr = arr + rng.normal(0.0, sigma, size=arr.shape).astype(np.float32)
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8)


def regular_polygon(cx, cy, radius, sides, rotation=0.0):
    """Vertices (x, y) of a regular polygon, rounded to 0.1 px."""
    return [(round(cx + radius * math.cos(rotation + 2 * math.pi * i / sides), 1),
             round(cy + radius * math.sin(rotation + 2 * math.pi * i / sides), 1))
            for i in range(sides)]


def shape_polygon(shape, cx, cy, size, rng):
    """Outline of a named shape of roughly ``size`` px centred at (cx, cy)."""
    r = size / 2
    if shape == 'circle':
        return regular_polygon(cx, cy, r, 24)
    if shape == 'triangle':  # pointing up, a little rotated
        return regular_polygon(cx, cy + 0.15 * r, 1.1 * r, 3,
                               -math.pi / 2 + rng.uniform(-0.2, 0.2))
    if shape == 'rectangle':  # wider than tall, like a screen
        hw, hh = r, r * rng.uniform(0.55, 0.8)
        return [(round(x, 1), round(y, 1)) for x, y in
                ((cx - hw, cy - hh), (cx + hw, cy - hh), (cx + hw, cy + hh),
                 (cx - hw, cy + hh))]
    if shape == 'square':
        return regular_polygon(cx, cy, r * 1.2, 4, math.pi / 4)
    if shape == 'star':
        pts = []
        for i in range(10):
            rad = r * (1.1 if i % 2 == 0 else 0.45)
            a = -math.pi / 2 + math.pi * i / 5
            pts.append((round(cx + rad * math.cos(a), 1),
                        round(cy + rad * math.sin(a), 1)))
        return pts
    raise ValueError(f'unknown shape {shape!r}')


def polygon_area(pts):
    """Shoelace area of a simple polygon."""
    s = 0.0
    for (x0, y0), (x1, y1) in zip(pts, pts[1:] + pts[:1]):
        s += x0 * y1 - x1 * y0
    return abs(s) / 2


def convex_hull(points):
    """Convex hull (Andrew's monotone chain), counter-clockwise."""
    pts = sorted(set(points))
    if len(pts) < 3:
        return pts

    def half(seq):
        out = []
        for p in seq:
            while len(out) >= 2 and ((out[-1][0] - out[-2][0]) * (p[1] - out[-2][1]) -
                                     (out[-1][1] - out[-2][1]) * (p[0] - out[-2][0])) <= 0:
                out.pop()
            out.append(p)
        return out

    return half(pts)[:-1] + half(pts[::-1])[:-1]


def place_boxes(rng, width, height, count, min_size, max_size, gap=4, tries=200):
    """Up to ``count`` non-overlapping squares (x0, y0, size) inside the image."""
    boxes = []
    for _ in range(tries):
        if len(boxes) == count:
            break
        size = int(rng.integers(min_size, max_size + 1))
        x0 = int(rng.integers(gap, width - size - gap + 1))
        y0 = int(rng.integers(gap, height - size - gap + 1))
        if all(x0 + size + gap <= bx or bx + bs + gap <= x0 or
               y0 + size + gap <= by or by + bs + gap <= y0
               for bx, by, bs in boxes):
            boxes.append((x0, y0, size))
    return boxes


def flat(points):
    """[(x, y), ...] -> [x, y, x, y, ...] (the COCO polygon format)."""
    return [float(v) for p in points for v in p]


def xywh(x0, y0, x1, y1):
    return [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)]


def save_jpeg(path, arr):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, 'RGB').save(path, format='JPEG', quality=95,
                                      subsampling=0, optimize=False)


def save_png(path, arr):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, 'L').save(path, format='PNG', compress_level=6)


def write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, sort_keys=True, separators=(',', ':')) + '\n')


def write_lines(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(''.join(line + '\n' for line in lines))


def coco_info(description):
    return dict(description=description, version='1.0', year=2017,
                contributor='clustr_mm tools/data/make_tiny_data.py',
                url='', date_created='2017/09/01')

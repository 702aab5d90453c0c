#!/usr/bin/env python
"""Generate the tiny embedded datasets into ``data/``.

Four datasets, each in the exact on-disk layout the stock OpenMMLab configs
read, small (a handful of images per split) but learnable: every label follows
visibly from the pixels.

==============  =============================================================
COCO instances  ``coco/annotations/instances_{train,val}2017.json`` and
                ``coco/{train,val}2017/*.jpg``. Coloured shapes, one shape
                and colour per category: a red circle is a ``sports ball``,
                a green triangle a ``kite``, a blue rectangle a ``tv``. Boxes,
                polygon masks, the full 80-category list with official ids.
ADE20K          ``ade/ADEChallengeData2016/{images,annotations}/{training,
                validation}``. Street scenes painted with one flat colour per
                class (sky, building, road, tree, person, car); label maps are
                uint8 PNGs, 0 = other (ignored with ``reduce_zero_label``),
                k = ADE class k-1.
COCO-WholeBody  ``coco/annotations/coco_wholebody_{train,val}_v1.0.json``,
                images ``coco/{train,val}2017/wb_*.jpg`` and
                ``coco/person_detection_results/
                COCO_val2017_detections_AP_H_56_person.json``. A stick figure
                with each of the 133 keypoints drawn as a dot of its own
                colour at its location.
ImageNet        ``imagenet/{train/<wnid>,val}/*.JPEG`` and
                ``imagenet/meta/{train,val}.txt`` (``path label``). Classes
                0..3, each one dominant shape and colour.
==============  =============================================================

Output is deterministic: fixed seeds, fixed encoder settings and sorted JSON
give the same bytes on every run (with the same numpy / Pillow builds).
A dataset that is already complete is skipped unless ``--force``::

    python tools/data/make_tiny_data.py [--out data] [--force] [--only coco ade20k]
"""
import argparse
import colorsys
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

# A dataset's stamp records the generator it came from: editing this file
# makes every stamp stale, so the next run regenerates.
GENERATOR = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
STAMP_DIR = '.tiny_data'

# --------------------------------------------------------------------------
# Shared helpers: randomness, drawing, writing
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# COCO instances
# --------------------------------------------------------------------------

# The official COCO 2017 detection categories: (id, name, supercategory).
COCO_CATEGORIES = [
    (1, 'person', 'person'), (2, 'bicycle', 'vehicle'), (3, 'car', 'vehicle'),
    (4, 'motorcycle', 'vehicle'), (5, 'airplane', 'vehicle'), (6, 'bus', 'vehicle'),
    (7, 'train', 'vehicle'), (8, 'truck', 'vehicle'), (9, 'boat', 'vehicle'),
    (10, 'traffic light', 'outdoor'), (11, 'fire hydrant', 'outdoor'),
    (13, 'stop sign', 'outdoor'), (14, 'parking meter', 'outdoor'),
    (15, 'bench', 'outdoor'), (16, 'bird', 'animal'), (17, 'cat', 'animal'),
    (18, 'dog', 'animal'), (19, 'horse', 'animal'), (20, 'sheep', 'animal'),
    (21, 'cow', 'animal'), (22, 'elephant', 'animal'), (23, 'bear', 'animal'),
    (24, 'zebra', 'animal'), (25, 'giraffe', 'animal'), (27, 'backpack', 'accessory'),
    (28, 'umbrella', 'accessory'), (31, 'handbag', 'accessory'), (32, 'tie', 'accessory'),
    (33, 'suitcase', 'accessory'), (34, 'frisbee', 'sports'), (35, 'skis', 'sports'),
    (36, 'snowboard', 'sports'), (37, 'sports ball', 'sports'), (38, 'kite', 'sports'),
    (39, 'baseball bat', 'sports'), (40, 'baseball glove', 'sports'),
    (41, 'skateboard', 'sports'), (42, 'surfboard', 'sports'),
    (43, 'tennis racket', 'sports'), (44, 'bottle', 'kitchen'),
    (46, 'wine glass', 'kitchen'), (47, 'cup', 'kitchen'), (48, 'fork', 'kitchen'),
    (49, 'knife', 'kitchen'), (50, 'spoon', 'kitchen'), (51, 'bowl', 'kitchen'),
    (52, 'banana', 'food'), (53, 'apple', 'food'), (54, 'sandwich', 'food'),
    (55, 'orange', 'food'), (56, 'broccoli', 'food'), (57, 'carrot', 'food'),
    (58, 'hot dog', 'food'), (59, 'pizza', 'food'), (60, 'donut', 'food'),
    (61, 'cake', 'food'), (62, 'chair', 'furniture'), (63, 'couch', 'furniture'),
    (64, 'potted plant', 'furniture'), (65, 'bed', 'furniture'),
    (67, 'dining table', 'furniture'), (70, 'toilet', 'furniture'),
    (72, 'tv', 'electronic'), (73, 'laptop', 'electronic'), (74, 'mouse', 'electronic'),
    (75, 'remote', 'electronic'), (76, 'keyboard', 'electronic'),
    (77, 'cell phone', 'electronic'), (78, 'microwave', 'appliance'),
    (79, 'oven', 'appliance'), (80, 'toaster', 'appliance'), (81, 'sink', 'appliance'),
    (82, 'refrigerator', 'appliance'), (84, 'book', 'indoor'), (85, 'clock', 'indoor'),
    (86, 'vase', 'indoor'), (87, 'scissors', 'indoor'), (88, 'teddy bear', 'indoor'),
    (89, 'hair drier', 'indoor'), (90, 'toothbrush', 'indoor'),
]

# The categories that actually occur: category id -> (shape, RGB colour).
COCO_OBJECTS = {
    37: ('circle', (220, 40, 40)),      # sports ball: red circle
    38: ('triangle', (40, 170, 60)),    # kite: green triangle
    72: ('rectangle', (40, 80, 220)),   # tv: blue rectangle
}
COCO_SPLITS = {'train': (16, 1), 'val': (8, 1001)}  # split: (images, first id)
COCO_SIZE = (192, 160)  # width, height


def make_coco_instances(root):
    """COCO 2017 instance segmentation: boxes + polygon masks."""
    root = Path(root) / 'coco'
    width, height = COCO_SIZE
    categories = [dict(id=i, name=n, supercategory=s) for i, n, s in COCO_CATEGORIES]
    cat_ids = sorted(COCO_OBJECTS)
    files = []
    for split, (num_images, first_id) in COCO_SPLITS.items():
        rng = make_rng('coco_instances', split)
        images, annotations = [], []
        for img_id in range(first_id, first_id + num_images):
            file_name = f'{img_id:012d}.jpg'
            img, draw = new_canvas(width, height, rng.integers(150, 215, size=3))
            boxes = place_boxes(rng, width, height, int(rng.integers(2, 5)), 26, 64)
            for x0, y0, size in boxes:
                cat_id = int(rng.choice(cat_ids))
                shape, colour = COCO_OBJECTS[cat_id]
                poly = shape_polygon(shape, x0 + size / 2, y0 + size / 2, size, rng)
                draw.polygon(poly, fill=colour)
                xs, ys = [p[0] for p in poly], [p[1] for p in poly]
                annotations.append(dict(
                    id=len(annotations) + first_id * 10, image_id=img_id,
                    category_id=cat_id, iscrowd=0,
                    bbox=xywh(min(xs), min(ys), max(xs), max(ys)),
                    area=round(polygon_area(poly), 2),
                    segmentation=[flat(poly)]))
            save_jpeg(root / f'{split}2017' / file_name, add_noise(img, rng))
            files.append(root / f'{split}2017' / file_name)
            images.append(dict(id=img_id, file_name=file_name, width=width,
                               height=height, license=1,
                               date_captured='2017-01-01 00:00:00'))
        ann_file = root / 'annotations' / f'instances_{split}2017.json'
        write_json(ann_file, dict(
            info=coco_info('clustr_mm tiny COCO instances'),
            licenses=[dict(id=1, name='CC0', url='')],
            images=images, annotations=annotations, categories=categories))
        files.append(ann_file)
    return files


# --------------------------------------------------------------------------
# ADE20K
# --------------------------------------------------------------------------

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


# --------------------------------------------------------------------------
# COCO-WholeBody
# --------------------------------------------------------------------------

BODY_NAMES = [
    'nose', 'left_eye', 'right_eye', 'left_ear', 'right_ear', 'left_shoulder',
    'right_shoulder', 'left_elbow', 'right_elbow', 'left_wrist', 'right_wrist',
    'left_hip', 'right_hip', 'left_knee', 'right_knee', 'left_ankle', 'right_ankle'
]
BODY_SKELETON = [[16, 14], [14, 12], [17, 15], [15, 13], [12, 13], [6, 12],
                 [7, 13], [6, 7], [6, 8], [7, 9], [8, 10], [9, 11], [2, 3],
                 [1, 2], [1, 3], [2, 4], [3, 5], [4, 6], [5, 7]]
PART_SIZES = dict(keypoints=17, foot_kpts=6, face_kpts=68, lefthand_kpts=21,
                  righthand_kpts=21)  # in COCO-WholeBody order: 133 in total
WB_SPLITS = {'train': (16, 2001), 'val': (8, 3001)}
WB_SIZE = (192, 256)
SKIN, LIMB, TORSO = (235, 200, 165), (70, 70, 75), (95, 95, 120)


def keypoint_colours(num=133):
    """One saturated colour per keypoint index (golden-ratio hue steps)."""
    out = []
    for k in range(num):
        hue = (k * 0.6180339887) % 1.0
        value = 1.0 if k % 2 == 0 else 0.75
        out.append(tuple(int(round(255 * c)) for c in colorsys.hsv_to_rgb(hue, 1.0, value)))
    return out


def _rot(v, angle):
    c, s = math.cos(angle), math.sin(angle)
    return (c * v[0] - s * v[1], s * v[0] + c * v[1])


def _add(p, v, scale=1.0):
    return (p[0] + scale * v[0], p[1] + scale * v[1])


def face_points(cx, cy, r):
    """68 face landmarks (iBUG order) on a head of radius r centred at (cx, cy)."""
    pts = []
    for t in np.linspace(math.pi, 0, 17):                      # 0-16 jaw
        pts.append((cx + 0.85 * r * math.cos(t), cy + 0.9 * r * math.sin(t)))
    for side in (-1, 1):                                       # 17-26 brows
        for t in np.linspace(-0.6, 0.6, 5):
            pts.append((cx + side * 0.4 * r + 0.3 * r * t,
                        cy - 0.42 * r - 0.08 * r * math.cos(1.5 * t)))
    for t in np.linspace(0, 1, 4):                             # 27-30 nose bridge
        pts.append((cx, cy - 0.3 * r + 0.5 * r * t))
    for t in np.linspace(-1, 1, 5):                            # 31-35 nostrils
        pts.append((cx + 0.18 * r * t, cy + 0.3 * r))
    for side in (-1, 1):                                       # 36-47 eyes
        ex = cx + side * 0.38 * r
        for t in np.linspace(math.pi, -math.pi, 7)[:-1]:
            pts.append((ex + 0.16 * r * math.cos(t), cy - 0.2 * r - 0.07 * r * math.sin(t)))
    for t in np.linspace(math.pi, -math.pi, 13)[:-1]:          # 48-59 outer lips
        pts.append((cx + 0.36 * r * math.cos(t), cy + 0.55 * r - 0.12 * r * math.sin(t)))
    for t in np.linspace(math.pi, -math.pi, 9)[:-1]:           # 60-67 inner lips
        pts.append((cx + 0.24 * r * math.cos(t), cy + 0.55 * r - 0.05 * r * math.sin(t)))
    return pts


def hand_points(wrist, direction, outward, length):
    """21 hand keypoints (OpenPose order): wrist, then thumb, index, middle,
    ring and little finger with four joints each, palm to tip. ``direction``
    is the unit forearm direction; the thumb points to the ``outward`` side
    (+1: image right, -1: image left)."""
    turn = 1.0 if -direction[1] * outward >= 0 else -1.0  # rotation sense to outward
    perp = _rot(direction, turn * math.pi / 2)
    pts = [wrist]
    p = _add(_add(wrist, direction, 0.15 * length), perp, 0.2 * length)
    pts.append(p)
    thumb = _rot(direction, turn * 0.7)
    for seg in (0.2, 0.17, 0.15):
        p = _add(p, thumb, seg * length)
        pts.append(p)
    for offset, spread, seg in ((0.2, 0.15, 0.17), (0.06, 0.05, 0.19),
                                (-0.08, -0.05, 0.17), (-0.22, -0.15, 0.14)):
        p = _add(_add(wrist, direction, 0.5 * length), perp, offset * length)
        pts.append(p)
        finger = _rot(direction, turn * spread)
        for _ in range(3):
            p = _add(p, finger, seg * length)
            pts.append(p)
    return pts


def wholebody_person(rng, width, height):
    """Random pose of a frontal stick figure; returns the keypoints of every
    part ({part: [(x, y), ...]}) and the head circle (cx, cy, r)."""
    while True:
        s = rng.uniform(185, 220)                        # figure height
        cx = width / 2 + rng.uniform(-8, 8)
        top = (height - s) / 2 + rng.uniform(-6, 6)
        r = 0.075 * s
        head = (cx + rng.uniform(-2, 2), top + r, r)
        face = face_points(*head)
        sh_y, hip_y = top + 2 * r + 0.06 * s, top + 0.5 * s
        body = {}
        body['nose'] = face[30]
        body['left_eye'] = tuple(np.mean(face[42:48], axis=0))
        body['right_eye'] = tuple(np.mean(face[36:42], axis=0))
        body['left_ear'] = (head[0] + r, head[1])
        body['right_ear'] = (head[0] - r, head[1])
        hands, feet = {}, {}
        for side, name in ((1, 'left'), (-1, 'right')):  # person's left = image right
            shoulder = (cx + side * 0.11 * s, sh_y)
            a1 = math.radians(rng.uniform(5, 35))
            a2 = a1 + math.radians(rng.uniform(-15, 35))
            elbow = _add(shoulder, (side * math.sin(a1), math.cos(a1)), 0.16 * s)
            fore = (side * math.sin(a2), math.cos(a2))
            wrist = _add(elbow, fore, 0.14 * s)
            hip = (cx + side * 0.07 * s, hip_y)
            b1 = math.radians(rng.uniform(0, 14))
            b2 = b1 + math.radians(rng.uniform(-6, 6))
            knee = _add(hip, (side * math.sin(b1), math.cos(b1)), 0.23 * s)
            ankle = _add(knee, (side * math.sin(b2), math.cos(b2)), 0.21 * s)
            body.update({f'{name}_shoulder': shoulder, f'{name}_elbow': elbow,
                         f'{name}_wrist': wrist, f'{name}_hip': hip,
                         f'{name}_knee': knee, f'{name}_ankle': ankle})
            hands[name] = hand_points(wrist, fore, side, 0.08 * s)
            feet[name] = [_add(ankle, (-side * 0.018 * s, 0.05 * s)),   # big toe
                          _add(ankle, (side * 0.03 * s, 0.045 * s)),    # small toe
                          _add(ankle, (side * 0.004 * s, 0.022 * s))]   # heel
        parts = dict(keypoints=[body[n] for n in BODY_NAMES],
                     foot_kpts=feet['left'] + feet['right'], face_kpts=face,
                     lefthand_kpts=hands['left'], righthand_kpts=hands['right'])
        allpts = [p for pts in parts.values() for p in pts]
        if all(3 <= x <= width - 4 and 3 <= y <= height - 4 for x, y in allpts):
            return parts, head


def draw_person(draw, parts, head, colours):
    """Body in neutral colours, then every keypoint as a dot of its colour."""
    kp = dict(zip(BODY_NAMES, parts['keypoints']))
    s = head[2] / 0.075
    limb_w = max(3, int(round(0.035 * s)))
    draw.polygon([kp['left_shoulder'], kp['right_shoulder'], kp['right_hip'],
                  kp['left_hip']], fill=TORSO)
    neck = (head[0], head[1] + head[2])
    draw.line([neck, ((kp['left_shoulder'][0] + kp['right_shoulder'][0]) / 2,
                      kp['left_shoulder'][1])], fill=LIMB, width=limb_w)
    for side in ('left', 'right'):
        chain = [kp[f'{side}_{j}'] for j in ('shoulder', 'elbow', 'wrist')]
        draw.line(chain, fill=LIMB, width=limb_w, joint='curve')
        chain = [kp[f'{side}_{j}'] for j in ('hip', 'knee', 'ankle')]
        draw.line(chain, fill=LIMB, width=limb_w + 1, joint='curve')
    feet = parts['foot_kpts']
    for ankle, (big, small, heel) in ((kp['left_ankle'], feet[0:3]),
                                      (kp['right_ankle'], feet[3:6])):
        draw.polygon([ankle, small, big], fill=LIMB)
    for hand in (parts['lefthand_kpts'], parts['righthand_kpts']):
        draw.polygon([hand[0], hand[5], hand[17]], fill=SKIN)
        for f in range(5):
            draw.line([hand[0]] + hand[1 + 4 * f:5 + 4 * f], fill=SKIN, width=2)
    cx, cy, r = head
    draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=SKIN)
    radius = dict(keypoints=2.5, foot_kpts=2.0, face_kpts=0.8, lefthand_kpts=0.8,
                  righthand_kpts=0.8)
    k = 0
    for part, pts in parts.items():
        rad = radius[part]
        for x, y in pts:
            draw.ellipse([x - rad, y - rad, x + rad, y + rad], fill=colours[k])
            k += 1


def _box(points, margin, width, height):
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x0, y0 = max(0.0, min(xs) - margin), max(0.0, min(ys) - margin)
    x1, y1 = min(width - 1.0, max(xs) + margin), min(height - 1.0, max(ys) + margin)
    return xywh(x0, y0, x1, y1)


def make_coco_wholebody(root):
    """COCO-WholeBody v1.0 (133 keypoints) + person detections for val."""
    root = Path(root) / 'coco'
    width, height = WB_SIZE
    colours = keypoint_colours(sum(PART_SIZES.values()))
    category = dict(id=1, name='person', supercategory='person',
                    keypoints=BODY_NAMES, skeleton=BODY_SKELETON)
    files, detections = [], []
    for split, (num_images, first_id) in WB_SPLITS.items():
        rng = make_rng('coco_wholebody', split)
        images, annotations = [], []
        for img_id in range(first_id, first_id + num_images):
            file_name = f'wb_{img_id:06d}.jpg'
            img, draw = new_canvas(width, height, rng.integers(150, 215, size=3))
            parts, head = wholebody_person(rng, width, height)
            draw_person(draw, parts, head, colours)
            save_jpeg(root / f'{split}2017' / file_name, add_noise(img, rng, sigma=4.0))
            files.append(root / f'{split}2017' / file_name)
            images.append(dict(id=img_id, file_name=file_name, width=width,
                               height=height, license=1,
                               date_captured='2017-01-01 00:00:00'))

            cx, cy, r = head
            outline = [p for pts in parts.values() for p in pts]
            outline += regular_polygon(cx, cy, r, 12)
            hull = [(round(x, 2), round(y, 2)) for x, y in convex_hull(
                [(round(x, 2), round(y, 2)) for x, y in outline])]
            ann = dict(id=img_id * 10, image_id=img_id, category_id=1, iscrowd=0,
                       bbox=_box(outline, 4, width, height),
                       area=round(polygon_area(hull), 2),
                       segmentation=[flat(hull)], num_keypoints=PART_SIZES['keypoints'],
                       face_box=_box(parts['face_kpts'], 2, width, height),
                       lefthand_box=_box(parts['lefthand_kpts'], 2, width, height),
                       righthand_box=_box(parts['righthand_kpts'], 2, width, height),
                       face_valid=True, lefthand_valid=True, righthand_valid=True,
                       foot_valid=True)
            for part, pts in parts.items():
                ann[part] = [v for x, y in pts for v in (round(x, 2), round(y, 2), 2)]
            annotations.append(ann)
            if split == 'val':  # a detector's box: the gt box, slightly off
                x, y, w, h = ann['bbox']
                dx, dy, dw, dh = rng.uniform(-3, 3, size=4)
                detections.append(dict(
                    image_id=img_id, category_id=1,
                    bbox=[round(float(max(0.0, x + dx)), 2),
                          round(float(max(0.0, y + dy)), 2),
                          round(float(w + dw), 2), round(float(h + dh), 2)],
                    score=round(float(rng.uniform(0.9, 1.0)), 4)))
        ann_file = root / 'annotations' / f'coco_wholebody_{split}_v1.0.json'
        write_json(ann_file, dict(
            info=coco_info('clustr_mm tiny COCO-WholeBody'),
            licenses=[dict(id=1, name='CC0', url='')],
            images=images, annotations=annotations, categories=[category]))
        files.append(ann_file)
    det_file = (root / 'person_detection_results' /
                'COCO_val2017_detections_AP_H_56_person.json')
    write_json(det_file, detections)
    files.append(det_file)
    return files


# --------------------------------------------------------------------------
# ImageNet
# --------------------------------------------------------------------------

# label (index into mmpretrain's 1000 ImageNet classes) -> (wnid, shape, colour)
IMAGENET_CLASSES = {
    0: ('n01440764', 'circle', (220, 40, 40)),     # tench: red circle
    1: ('n01443537', 'square', (40, 170, 60)),     # goldfish: green square
    2: ('n01484850', 'triangle', (40, 80, 220)),   # great white shark: blue triangle
    3: ('n01491361', 'star', (235, 200, 30)),      # tiger shark: yellow star
}
IMAGENET_SPLITS = {'train': 8, 'val': 4}  # images per class
IMAGENET_SIZE = 128


def _imagenet_image(rng, label):
    size = IMAGENET_SIZE
    img, draw = new_canvas(size, size, rng.integers(110, 200, size=3))
    others = [k for k in IMAGENET_CLASSES if k != label]
    for _ in range(int(rng.integers(0, 3))):  # small distractors of other classes
        _, shape, colour = IMAGENET_CLASSES[int(rng.choice(others))]
        d = int(rng.integers(10, 18))
        x, y = rng.uniform(d, size - d, size=2)
        draw.polygon(shape_polygon(shape, x, y, d, rng), fill=colour)
    _, shape, colour = IMAGENET_CLASSES[label]  # the dominant object
    d = int(rng.integers(56, 84))
    x, y = rng.uniform(d / 2 + 4, size - d / 2 - 4, size=2)
    draw.polygon(shape_polygon(shape, x, y, d, rng), fill=colour)
    return add_noise(img, rng, sigma=6.0)


def make_imagenet(root):
    """ImageNet-1k layout: train/<wnid>/*.JPEG, flat val/, meta/{train,val}.txt."""
    root = Path(root) / 'imagenet'
    files = []
    for split, per_class in IMAGENET_SPLITS.items():
        rng = make_rng('imagenet', split)
        lines = []
        for label, (wnid, _, _) in IMAGENET_CLASSES.items():
            for i in range(1, per_class + 1):
                if split == 'train':
                    rel = f'{wnid}/{wnid}_{i:05d}.JPEG'
                else:
                    rel = f'ILSVRC2012_val_{label * per_class + i:08d}.JPEG'
                save_jpeg(root / split / rel, _imagenet_image(rng, label))
                files.append(root / split / rel)
                lines.append(f'{rel} {label}')
        write_lines(root / 'meta' / f'{split}.txt', lines)
        files.append(root / 'meta' / f'{split}.txt')
    return files


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------

DATASETS = {
    'coco': make_coco_instances,
    'ade20k': make_ade20k,
    'coco_wholebody': make_coco_wholebody,
    'imagenet': make_imagenet,
}


def _stamp_path(out, name):
    return Path(out) / STAMP_DIR / f'{name}.json'


def is_complete(out, name):
    """True when ``name`` was made by this generator and all its files exist."""
    stamp = _stamp_path(out, name)
    if not stamp.is_file():
        return False
    try:
        info = json.loads(stamp.read_text())
    except ValueError:
        return False
    return (info.get('generator') == GENERATOR and
            all((Path(out) / f).is_file() for f in info.get('files', [])))


def generate(out='data', force=False, only=None, log=print):
    """Generate the datasets named in ``only`` (default: all) under ``out``.

    Returns {name: [relative paths written]}; skipped datasets map to [].
    """
    out = Path(out)
    written = {}
    for name in (only or DATASETS):
        if not force and is_complete(out, name):
            log(f'[tiny-data] {name}: complete, skipped (use --force to rebuild)')
            written[name] = []
            continue
        files = sorted(str(f.relative_to(out)) for f in DATASETS[name](out))
        write_json(_stamp_path(out, name), dict(generator=GENERATOR, files=files))
        num_bytes = sum((out / f).stat().st_size for f in files)
        log(f'[tiny-data] {name}: wrote {len(files)} files, '
            f'{num_bytes / 2**20:.2f} MB')
        for group, count in _summarise(files):
            log(f'[tiny-data]   {out / group}  ({count})')
        written[name] = files
    return written


def _summarise(files):
    """Group written files by folder for the log: [(folder or file, count)]."""
    groups = {}
    for f in files:
        p = Path(f)
        key = str(p.parent) + '/' if p.suffix.lower() in ('.jpg', '.jpeg', '.png') else f
        groups[key] = groups.get(key, 0) + 1
    return sorted(groups.items())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='data', help='output root (default: data)')
    parser.add_argument('--force', action='store_true',
                        help='rebuild datasets that are already complete')
    parser.add_argument('--only', nargs='+', choices=sorted(DATASETS),
                        help='generate only these datasets')
    args = parser.parse_args(argv)
    generate(args.out, force=args.force, only=args.only)
    return 0


if __name__ == '__main__':
    sys.exit(main())

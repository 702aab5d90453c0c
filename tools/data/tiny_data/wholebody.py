"""COCO-WholeBody: a stick figure whose 133 keypoints are dots of their own
colour, plus the person detections the top-down configs read."""
import colorsys
import math
from pathlib import Path

import numpy as np
from .common import (make_rng, new_canvas, add_noise, regular_polygon,
                     polygon_area, convex_hull, flat, xywh, save_jpeg,
                     write_json, coco_info)


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

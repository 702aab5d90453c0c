"""COCO 2017 instances: coloured shapes with boxes and polygon masks."""
from pathlib import Path

from .common import (make_rng, new_canvas, add_noise, shape_polygon,
                     polygon_area, place_boxes, flat, xywh, save_jpeg,
                     write_json, coco_info)


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

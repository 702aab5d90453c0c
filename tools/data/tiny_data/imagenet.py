"""ImageNet: four classes, each one dominant shape and colour, with the
``meta/{train,val}.txt`` lists mmpretrain reads."""
from pathlib import Path

from .common import (make_rng, new_canvas, add_noise, shape_polygon, save_jpeg,
                     write_lines)


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

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
The generators live in the ``tiny_data`` package next to this script, one
module per dataset. A dataset that is already complete is skipped unless
``--force``::

    python tools/data/make_tiny_data.py [--out data] [--force] [--only coco ade20k]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_data import DATASETS, GENERATOR, generate, is_complete  # noqa: E402
# The tables the tests read the labels from.
from tiny_data.ade20k import ADE_CLASSES  # noqa: E402
from tiny_data.coco import COCO_CATEGORIES, COCO_OBJECTS  # noqa: E402
from tiny_data.imagenet import IMAGENET_CLASSES  # noqa: E402
from tiny_data.wholebody import PART_SIZES, keypoint_colours  # noqa: E402

__all__ = ['DATASETS', 'GENERATOR', 'generate', 'is_complete', 'main',
           'ADE_CLASSES', 'COCO_CATEGORIES', 'COCO_OBJECTS', 'IMAGENET_CLASSES',
           'PART_SIZES', 'keypoint_colours']


def _folder(text: str) -> str:
    """The output root: a folder (a file there, or an empty name, is
    refused when the command line is read)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f'{text!r} is empty; name a folder (. for the current one)')
    if Path(text).exists() and not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f'{text!r} is a file, not a folder')
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--out', default='data', type=_folder,
                        help='output root (default: data)')
    parser.add_argument('--force', action='store_true',
                        help='rebuild datasets that are already complete')
    parser.add_argument('--only', nargs='+', choices=sorted(DATASETS),
                        help='generate only these datasets')
    args = parser.parse_args(argv)
    generate(args.out, force=args.force, only=args.only)
    return 0


if __name__ == '__main__':
    sys.exit(main())

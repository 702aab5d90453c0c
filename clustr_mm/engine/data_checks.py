"""Cheap checks of a config's data before a run, naming the file and value.

The libraries fail on bad data late and without saying where: an empty
ImageNet list or a COCO file without annotations gives "need at least one
array to concatenate", a zero-byte JPEG an image-decoding error, a label
beyond the classes an index error inside the loss. ``tools/train.py`` and
``tools/test.py`` call :func:`check_data` on the dataloaders they will use
before the runner is built. What is read: annotation lists and COCO files
(files up to :data:`MAX_JSON_BYTES`), one ``stat`` per listed image, and the
first :data:`MAX_LABEL_MAPS` segmentation label maps (a full ADE20K
training set has 20,210: reading them all would take minutes).
"""
import json
import math
import os
import os.path as osp
from fractions import Fraction
from typing import Iterable, List, Optional, Tuple

from ..protocols import backbone_strides

MAX_JSON_BYTES = 64 << 20
MAX_LABEL_MAPS = 200
IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.webp', '.tif', '.tiff')
WRAPPERS = ('dataset', 'datasets')


class DataCheckError(ValueError):
    """The data a config points at cannot be trained or evaluated on."""


def _get(node, key, default=None):
    return node.get(key, default) if hasattr(node, 'get') else default


def leaf_datasets(dataset) -> Iterable:
    """The leaf dataset configs under wrappers (Repeat, ClassBalanced,
    Concat)."""
    if not hasattr(dataset, 'get'):
        return
    inner = [_get(dataset, k) for k in WRAPPERS if _get(dataset, k)]
    if not inner:
        yield dataset
        return
    for item in inner:
        for leaf in (item if isinstance(item, (list, tuple)) else [item]):
            yield from leaf_datasets(leaf)


def _join(root: str, path: str) -> str:
    return path if not root or osp.isabs(path) else osp.join(root, path)


def _prefix(dataset, key: str) -> str:
    prefix = _get(dataset, 'data_prefix') or ''
    if isinstance(prefix, str):
        return prefix
    return _get(prefix, key, '') or ''


def _few(items: List[str], n: int = 3) -> str:
    more = f', ... {len(items) - n} more' if len(items) > n else ''
    return ', '.join(items[:n]) + more


def _bad_images(paths: Iterable[str]) -> Tuple[List[str], List[str]]:
    """(missing, zero-byte) among ``paths``: one stat each."""
    missing, empty = [], []
    for path in paths:
        try:
            if os.stat(path).st_size == 0:
                empty.append(path)
        except OSError:
            missing.append(path)
    return missing, empty


def _report_images(where: str, paths: List[str]) -> None:
    missing, empty = _bad_images(paths)
    if empty:
        raise DataCheckError(
            f'{where}: {len(empty)} of {len(paths)} images are empty '
            f'(0 bytes): {_few(empty)}; remove them from the annotations or '
            'replace the files')
    if missing:
        raise DataCheckError(
            f'{where}: {len(missing)} of {len(paths)} images do not exist: '
            f'{_few(missing)}')


def check_image_list(path: str, image_dir: str,
                     num_classes: Optional[int]) -> None:
    """An mmpretrain ``path label`` list: not empty, labels in
    ``[0, num_classes)``, every image present and non-empty."""
    entries = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            name, _, label = line.rpartition(' ')
            if not name:  # no label: an unlabelled list (e.g. test)
                name, label = label, None
            if label is not None:
                try:
                    value = int(label)
                except ValueError:
                    raise DataCheckError(
                        f'{path} line {number}: label {label!r} is not an '
                        'int (lines are "relative/path.JPEG label")') from None
                if value < 0 or (num_classes is not None
                                 and value >= num_classes):
                    raise DataCheckError(
                        f'{path} line {number}: label {value} is outside the '
                        f'{num_classes} classes of the model (0..'
                        f'{(num_classes or 0) - 1}): {line!r}')
            entries.append(_join(image_dir, name))
    if not entries:
        raise DataCheckError(
            f'{path} lists no images (an empty annotation list): nothing to '
            'train or evaluate on')
    _report_images(path, entries)


def check_coco_file(path: str, image_dir: str, needs_annotations: bool
                    ) -> Optional[dict]:
    """A COCO-style JSON: images listed and present, annotations present
    (when the split is trained or evaluated against them). Returns the
    parsed file (None where it was not read)."""
    if os.path.getsize(path) > MAX_JSON_BYTES:
        return None  # the library parses it anyway; too slow to read twice
    with open(path) as f:
        try:
            data = json.load(f)
        except ValueError as err:
            raise DataCheckError(f'{path} is not valid JSON: {err}') from None
    if not isinstance(data, dict) or 'images' not in data:
        return None  # not COCO-style (e.g. a detection-results file)
    images = data.get('images') or []
    if not images:
        raise DataCheckError(f'{path} lists no images ("images" is empty)')
    if needs_annotations and not data.get('annotations'):
        raise DataCheckError(
            f'{path} has no annotations ({len(images)} images, 0 '
            'annotations): nothing to train or evaluate against')
    _report_images(path, [_join(image_dir, im.get('file_name', ''))
                          for im in images])
    return data


# The keypoint arrays of a person in the pose datasets we ship (mmpose's
# order), as (field, keypoints).
POSE_KEYPOINTS = {
    'CocoWholeBodyDataset': (('keypoints', 17), ('foot_kpts', 6),
                             ('face_kpts', 68), ('lefthand_kpts', 21),
                             ('righthand_kpts', 21)),
    'CocoDataset': (('keypoints', 17), ),
}


def _finite(values) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v)
               for v in values)


def check_pose_file(path: str, data: dict, dataset_type: str) -> None:
    """A top-down keypoint file: each person's box finite with a positive
    size, each keypoint array of the dataset type there with the right
    length and finite values, and at least one person that mmpose keeps
    (not crowd, a visible keypoint). mmpose itself turns a NaN box into
    target weights of 0 and trains on a loss of exactly 0, and reads a
    COCO body file as whole-body until an index error in the flip."""
    arrays = POSE_KEYPOINTS.get(dataset_type, ())
    people = data.get('annotations') or []
    kept = crowd = 0
    for ann in people:
        if ann.get('iscrowd'):
            crowd += 1
            continue
        where = f'{path}: annotation id {ann.get("id")}'
        box = ann.get('bbox')
        if not isinstance(box, list) or len(box) != 4:
            raise DataCheckError(f'{where}: bbox {box!r} is not [x, y, w, h]')
        if not _finite(box):
            raise DataCheckError(
                f'{where}: bbox {box} is not finite; mmpose would train this '
                'person with every target weight 0 (a loss of exactly 0)')
        if box[2] <= 0 or box[3] <= 0:
            raise DataCheckError(
                f'{where}: bbox {box} has width x height {box[2]} x {box[3]}; '
                'a person box needs a positive size')
        visible = 0
        for field, count in arrays:
            if field not in ann:
                names = ', '.join(f for f, _ in arrays)
                found = sum(len(ann.get(f) or []) // 3 for f, _ in arrays)
                raise DataCheckError(
                    f'{where} has no {field!r}: a {dataset_type} person has '
                    f'{names} ({sum(c for _, c in arrays)} keypoints); a '
                    f'file with {found} keypoints per person belongs to '
                    'another dataset type')
            values = ann[field]
            if not isinstance(values, list) or len(values) != 3 * count:
                raise DataCheckError(
                    f'{where}: {field} has {len(values or [])} values, a '
                    f'{dataset_type} file {3 * count} ({count} keypoints x '
                    '(x, y, visibility))')
            if not _finite(values):
                raise DataCheckError(f'{where}: {field} has non-finite '
                                     'values')
            visible += sum(v > 0 for v in values[2::3])
        kept += bool(visible and ann.get('num_keypoints', visible))
    if people and not kept:
        fields = ', '.join(f for f, _ in arrays) or 'keypoints'
        raise DataCheckError(
            f'{path}: none of its {len(people)} people is one mmpose trains '
            f'on: {crowd} are crowd (iscrowd 1), {len(people) - crowd} have '
            f'no visible keypoint (visibility 0 or num_keypoints 0 in '
            f'{fields}); mmpose drops them all and there is nothing to train '
            'on')


def _strip_scope(name) -> str:
    return str(name or '').rpartition('.')[2]


def _model_stride(model) -> Optional[int]:
    """The stride of the maps a pose head gets from our backbones (and
    necks), or None for modules this check does not know."""
    from ..models import backbones, necks
    backbone = _get(model, 'backbone') or {}
    strides = backbone_strides(
        getattr(backbones, _strip_scope(_get(backbone, 'type')), None))
    if strides is None:
        return None
    indices = _get(backbone, 'out_indices', (0, 1, 2, 3))
    indices = [indices] if isinstance(indices, int) else list(indices)
    neck = _get(model, 'neck')
    if neck:
        neck_cls = getattr(necks, _strip_scope(_get(neck, 'type')), None)
        if neck_cls is None:
            return None
        return strides[indices[neck_cls.output_level]]
    return strides[indices[-1]]  # mmpose's heads read the last map


def check_pose_model(cfg, dataset) -> None:
    """The head predicts the dataset's keypoints, and the codec's heatmap is
    the size the model produces: input size / (backbone stride / 2 per
    deconvolution of the head)."""
    model = cfg.get('model') or {}
    head = _get(model, 'head') or {}
    dataset_type = _strip_scope(_get(dataset, 'type'))
    arrays = POSE_KEYPOINTS.get(dataset_type)
    out = _get(head, 'out_channels')
    if arrays and isinstance(out, int):
        count = sum(c for _, c in arrays)
        if out != count:
            raise DataCheckError(
                f'model.head.out_channels={out}, but {dataset_type} has '
                f'{count} keypoints: the head must predict one heatmap per '
                'keypoint')
    codec = _get(head, 'decoder') or {}
    size, heatmap = _get(codec, 'input_size'), _get(codec, 'heatmap_size')
    backbone = _model_stride(model)
    if not size or not heatmap or backbone is None:
        return
    deconvs = len(_get(head, 'deconv_out_channels') or ())
    stride = Fraction(backbone, 2 ** deconvs)  # input pixels per heatmap px
    expected = tuple(int(s // stride) for s in size)
    if tuple(heatmap) != expected or any(s % stride for s in size):
        raise DataCheckError(
            f'codec: heatmap_size {tuple(heatmap)} is not input_size '
            f'{tuple(size)} / {stride} = {expected}, the size of the maps '
            f'the model predicts (backbone stride {backbone}, {deconvs} 2x '
            'deconvolutions in the head); set heatmap_size to '
            f'{expected} or input_size to a multiple of {stride}')


def check_label_maps(label_dir: str, num_classes: Optional[int],
                     reduce_zero_label: bool, ignore_index: int = 255
                     ) -> None:
    """Segmentation label maps: values are classes or the ignore index (with
    ``reduce_zero_label`` the stored values are 0 (ignored) and 1..C)."""
    import numpy as np
    from PIL import Image
    if not osp.isdir(label_dir):
        raise DataCheckError(f'label map folder {label_dir} does not exist')
    files = sorted(osp.join(root, name)
                   for root, _, names in os.walk(label_dir)
                   for name in names if name.lower().endswith('.png'))
    if not files:
        raise DataCheckError(f'{label_dir} holds no .png label maps')
    _report_images(label_dir, files)
    if num_classes is None:
        return
    top = num_classes if reduce_zero_label else num_classes - 1
    for path in files[:MAX_LABEL_MAPS]:
        values = np.unique(np.asarray(Image.open(path)))
        bad = [int(v) for v in values if v > top and v != ignore_index]
        if bad:
            stored = (f'1..{top} (0 is ignored: reduce_zero_label)'
                      if reduce_zero_label else f'0..{top}')
            raise DataCheckError(
                f'{path}: label value(s) {bad} beyond the {num_classes} '
                f'classes of the model (stored values {stored}, '
                f'{ignore_index} ignored)')


def _num_classes(cfg, scope: str) -> Optional[int]:
    model = cfg.get('model') or {}
    head = _get(model, 'decode_head' if scope == 'mmseg' else 'head')
    value = _get(head, 'num_classes')
    return value if isinstance(value, int) else None


def _reduce_zero_label(dataset) -> bool:
    for step in _get(dataset, 'pipeline') or []:
        if _get(step, 'type') == 'LoadAnnotations' and _get(
                step, 'reduce_zero_label') is not None:
            return bool(step['reduce_zero_label'])
    value = _get(dataset, 'reduce_zero_label')
    if value is not None:
        return bool(value)
    return 'ADE20K' in str(_get(dataset, 'type', ''))


def check_dataset(cfg, dataset, split: str) -> None:
    """Check one dataset config of ``cfg`` (see the module docstring)."""
    scope = cfg.get('default_scope')
    root = _get(dataset, 'data_root') or ''
    ann = _get(dataset, 'ann_file') or ''
    split = _get(dataset, 'split')
    if (scope == 'mmpretrain' and not ann and split
            and osp.isfile(_join(root, f'meta/{split}.txt'))):
        # mmpretrain's ImageNet: split='train' reads meta/train.txt, train/
        ann = f'meta/{split}.txt'
        dataset = dict(dataset, data_prefix=_get(dataset, 'data_prefix')
                       or split)
    if ann:
        path = _join(root, ann)
        if not osp.isfile(path):
            raise DataCheckError(f'{split} dataset: ann_file {path} does not '
                                 'exist')
        if scope == 'mmpretrain' and path.endswith('.txt'):
            check_image_list(path, _join(root, _prefix(dataset, 'img_path')),
                             _num_classes(cfg, scope))
        elif path.endswith('.json'):
            data = check_coco_file(
                path, _join(root, _prefix(dataset, 'img')),
                needs_annotations=not _get(dataset, 'test_mode'))
            if scope == 'mmpose' and data is not None:
                check_pose_file(path, data,
                                _strip_scope(_get(dataset, 'type')))
    if scope == 'mmpose':
        check_pose_model(cfg, dataset)
    if scope == 'mmseg' and _prefix(dataset, 'seg_map_path'):
        check_label_maps(_join(root, _prefix(dataset, 'seg_map_path')),
                         _num_classes(cfg, scope),
                         _reduce_zero_label(dataset),
                         _get(dataset, 'ignore_index', 255))


def check_data(cfg, loaders: Iterable[str]) -> None:
    """Check the datasets of the named dataloaders of ``cfg`` (e.g.
    ``train_dataloader``); raises :class:`DataCheckError` naming the file
    and the value."""
    for name in loaders:
        loader = cfg.get(name)
        if not loader:
            continue
        for dataset in leaf_datasets(_get(loader, 'dataset')):
            check_dataset(cfg, dataset, name.replace('_dataloader', ''))

"""Generators of the tiny embedded datasets, one module per dataset.

``tools/data/make_tiny_data.py`` is the command line; this package holds the
dataset makers (:mod:`.coco`, :mod:`.ade20k`, :mod:`.wholebody`,
:mod:`.imagenet`), their shared helpers (:mod:`.common`) and the bookkeeping
that skips a dataset which is already complete.
"""
import hashlib
import json
from pathlib import Path

from .ade20k import make_ade20k
from .coco import make_coco_instances
from .common import write_json
from .imagenet import make_imagenet
from .wholebody import make_coco_wholebody

DATASETS = {
    'coco': make_coco_instances,
    'ade20k': make_ade20k,
    'coco_wholebody': make_coco_wholebody,
    'imagenet': make_imagenet,
}
STAMP_DIR = '.tiny_data'


def _generator_hash():
    """A digest of every source file of the generator.

    A dataset's stamp records it, so editing any of these files makes every
    stamp stale and the next run regenerates.
    """
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob('*.py')):
        digest.update(path.name.encode() + b'\0' + path.read_bytes())
    return digest.hexdigest()[:16]


GENERATOR = _generator_hash()


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

"""Reading checkpoint files: the one path every weight file takes.

:func:`install_checkpoint_loaders` (run on ``import clustr_mm``) makes
:func:`load_checkpoint_file` MMEngine's loader for local paths and http(s)
URLs, so the runner's ``load_from`` and ``--resume``, ``tools/test.py CONFIG
CHECKPOINT``, the Inferencers' weights, ``Pretrained`` init of any module
(our backbones read through MMEngine's ``CheckpointLoader`` too) and the
converter tools all get the same behaviour:

* URLs are fetched once into torch's hub cache (:mod:`.download`);
* nothing in the file can run code (:mod:`.safe_pickle`);
* a file of a layout a converter knows (the official PaCa-ViT and ClusTR
  code's, ClusTR's earlier clustr_mm keys) is converted to our keys on the
  fly (:func:`.official.convert_checkpoint`, one log line);
* a bad path, a directory, a text file, a truncated file or a CUDA
  ``map_location`` on a machine without CUDA is an error naming the file,
  what was found and what is expected.
"""
import os.path as osp
import pickle
import re
from typing import Any, Mapping

import torch

from .download import discard_cached, download_checkpoint
from .keys import StateDict, strip_module_prefix, unwrap_state_dict
from .official import convert_checkpoint
from .safe_pickle import allow_runner_checkpoint_types, safe_load

ZIP_MAGIC = b'PK\x03\x04'  # torch.save's format since torch 1.6


def _is_url(filename: str) -> bool:
    return filename.startswith(('http://', 'https://'))


def _check_map_location(map_location, filename: str) -> None:
    wants_cuda = (isinstance(map_location, torch.device)
                  and map_location.type == 'cuda') or (
                      isinstance(map_location, str)
                      and map_location.startswith('cuda'))
    if wants_cuda and not torch.cuda.is_available():
        raise ValueError(
            f'map_location={map_location!r} asks to load {filename} onto a '
            'CUDA device, but torch.cuda.is_available() is False here; use '
            "map_location='cpu'")


def _what_it_is(path: str) -> str:
    """A short description of a file torch could not load."""
    with open(path, 'rb') as f:
        head = f.read(64)
    if not head:
        return 'an empty file'
    if head.startswith(ZIP_MAGIC):
        return 'a torch zip file that is truncated or corrupt'
    if head.startswith(b'\x80'):
        return 'a pickle (legacy torch format) that is truncated or corrupt'
    try:
        text = head.decode('utf-8')
    except UnicodeDecodeError:
        return f'not a torch checkpoint (starts with {head[:16]!r})'
    return f'a text file, not a torch checkpoint (starts with {text[:40]!r})'


def load_checkpoint_file(filename: str, map_location=None,
                         check_hash: bool = False,
                         convert: bool = True) -> Any:
    """Read a checkpoint from a local path or an http(s) URL, safely.

    ``check_hash``: check a download against the sha256 prefix in its name
    (torch.hub's convention; off by default, as there). ``convert=False``
    returns an official file as it is (for tools that must tell what a file
    is).

    Returns what the file holds (a runner checkpoint unchanged); a file of a
    layout a converter knows (official PaCa-ViT or ClusTR, ClusTR's earlier
    keys) comes back converted, as ``{'state_dict', 'meta'}`` in our model's
    keys.
    """
    if not isinstance(filename, str):
        raise TypeError(f'checkpoint must be a path or URL string, got '
                        f'{type(filename).__name__}: {filename!r}')
    if _is_url(filename):
        path = download_checkpoint(filename, check_hash=check_hash)
    else:
        path = osp.expanduser(filename)
        if osp.isdir(path):
            raise IsADirectoryError(
                f'checkpoint {filename} is a directory; expected a weights '
                'file such as its epoch_N.pth / iter_N.pth (the file named in '
                'its last_checkpoint is the latest)')
        if not osp.isfile(path):
            raise FileNotFoundError(f'checkpoint file not found: {filename}')
    _check_map_location(map_location, filename)
    try:
        checkpoint = safe_load(path, map_location=map_location)
    except Exception as e:  # noqa: BLE001 (torch raises many kinds for a bad file)
        unsafe = re.search(r'(?:Unsupported global: |unsupported )GLOBAL (\S+)',
                           str(e))
        where = filename if path == filename else f'{filename} ({path})'
        if unsafe:
            message = (
                f'refusing to load {where}: it pickles {unsafe.group(1)}, '
                'which could run code on load (Weights only load failed). '
                'Only tensors and plain data are loaded; re-save the weights '
                'alone if you trust the file.')
        else:
            message = (f'cannot read checkpoint {where}: it is '
                       f'{_what_it_is(path)} ({type(e).__name__} from '
                       'torch.load); expected a file written by torch.save')
        if _is_url(filename):
            discard_cached(path)
            message += ('; the downloaded copy was removed from the cache, '
                        'so the next run fetches it again')
        error = pickle.UnpicklingError if unsafe else ValueError
        raise error(message) from None
    if convert and isinstance(checkpoint, Mapping):
        converted = convert_checkpoint(checkpoint, filename)
        if converted is not None:
            return converted
    return checkpoint


def read_checkpoint(filename: str, map_location='cpu',
                    convert: bool = True) -> StateDict:
    """The state dict of a checkpoint file (:func:`load_checkpoint_file`),
    unwrapped from ``state_dict`` / ``model`` and without a DataParallel
    ``module.`` prefix."""
    checkpoint = load_checkpoint_file(filename, map_location,
                                      convert=convert)
    if not isinstance(checkpoint, Mapping):
        raise TypeError(f'{filename} holds a {type(checkpoint).__name__}, '
                        'expected a state dict')
    return strip_module_prefix(unwrap_state_dict(checkpoint))


def _mmengine_loader(filename, map_location=None):
    return load_checkpoint_file(filename, map_location)


_mmengine_loader.__name__ = 'load_from_clustr_mm'  # named in MMEngine's log


def install_checkpoint_loaders() -> None:
    """Register :func:`load_checkpoint_file` for MMEngine's local-path and
    http(s) checkpoint schemes, after choosing the safe-load mode
    (idempotent)."""
    from mmengine.runner.checkpoint import CheckpointLoader
    allow_runner_checkpoint_types()
    CheckpointLoader.register_scheme(prefixes='', loader=_mmengine_loader,
                                     force=True)
    CheckpointLoader.register_scheme(prefixes=('http://', 'https://'),
                                     loader=_mmengine_loader, force=True)

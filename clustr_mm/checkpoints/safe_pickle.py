"""Checkpoint loading that never runs code, on every torch from 2.0.

A ``torch.save`` file is a pickle, and a pickle can call any importable
function while it loads. Loading is made safe by allow-listing: only tensors,
containers and a few data-only classes may be rebuilt, any other global in the
pickle is refused *before* it is called.

MMEngine 0.10.7 runner checkpoints also pickle the message hub
(``HistoryBuffer`` objects holding numpy arrays), so a plain weights-only load
breaks ``--resume``. We allow exactly the few data-only types those
checkpoints contain (:data:`RUNNER_CHECKPOINT_TYPES`). ``HistoryBuffer``
pickles its statistics methods as ``getattr(HistoryBuffer, 'mean')``; allowing
``builtins.getattr`` itself would let a crafted pickle walk from any allowed
object to arbitrary code, so under that name we allow
:func:`history_buffer_getattr`, which resolves only those methods.

How the allow-list is enforced depends on what the installed torch offers,
detected by behaviour, not by version number (:func:`allow_runner_checkpoint_types`):

``'native'``
    ``torch.serialization.add_safe_globals`` exists *and* accepts the
    ``(object, 'module.name')`` form (needed to register our restricted getattr
    as ``builtins.getattr``); a probe round-trip of a runner-style checkpoint
    through ``torch.load(weights_only=True)`` must succeed. Loads go through
    torch's own weights-only unpickler.
``'restricted'``
    Older torch (2.0-2.3 have no ``add_safe_globals``; 2.4/2.5 lack the tuple
    form). Loads call ``torch.load(weights_only=False,
    pickle_module=restricted_pickle)``: torch's loader (zip container, storages,
    ``map_location``) with a standard :class:`pickle.Unpickler` whose
    ``find_class`` returns only allow-listed globals -- torch's own
    weights-only list plus ours -- and raises ``UnpicklingError`` for any other.
    A pickle can reach a callable only through ``find_class`` (there is no
    attribute-access opcode), so a refused global is never imported or called.

``CLUSTR_MM_SAFE_LOAD=restricted`` forces the second mode on any torch (the
tests use it to run the fallback on the default stack too).

Release files of training scripts also pickle an ``argparse.Namespace`` (the
script's arguments) and numpy scalars (metrics); both are plain data and
allowed. MMEngine's own loads (``--resume``, ``load_from``, ``tools/test.py``,
``Pretrained`` init) go through :func:`safe_load` as well: see
:mod:`clustr_mm.checkpoints.loading`, which registers the loaders.

Errors on a refused global start with ``Weights only load failed`` and name the
global as ``GLOBAL module.name`` in both modes.
"""
import _compat_pickle
import argparse
import collections
import importlib
import io
import os
import pickle
import types
from typing import Any, Dict, Optional

import numpy as np
import torch
from mmengine.logging import HistoryBuffer


def _numpy_multiarray():
    """numpy's multiarray module: ``numpy._core`` (numpy >= 2, and a shim in
    1.26) or ``numpy.core`` (older numpy; deprecated in numpy 2)."""
    for name in ('numpy._core.multiarray', 'numpy.core.multiarray'):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError('numpy multiarray module not found')


_MULTIARRAY = _numpy_multiarray()


def _numpy_globals() -> Dict[str, Any]:
    """Data-only numpy globals under every name a pickle may use for them.

    numpy 1.x pickles ``numpy.core.multiarray._reconstruct``, numpy 2.x
    ``numpy._core.multiarray._reconstruct``; either may be loaded by either.
    """
    found = {'numpy.ndarray': np.ndarray, 'numpy.dtype': np.dtype}
    for prefix in ('numpy.core.multiarray', 'numpy._core.multiarray'):
        found[f'{prefix}._reconstruct'] = _MULTIARRAY._reconstruct
        found[f'{prefix}.scalar'] = _MULTIARRAY.scalar
    # numpy >= 1.25 pickles dtypes as instances of per-type classes.
    for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
              np.uint16, np.uint32, np.uint64, np.float16, np.float32,
              np.float64):
        cls = type(np.dtype(t))
        if cls is not np.dtype:
            found[f'{cls.__module__}.{cls.__name__}'] = cls
    return found


def history_buffer_getattr(obj, name: str):
    """``getattr`` restricted to HistoryBuffer's public statistics methods."""
    if obj is HistoryBuffer and name in ('min', 'max', 'current', 'mean'):
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); only '
        'HistoryBuffer statistics methods are allowed')


def latin1_encode(text: str, encoding: str = 'latin1') -> bytes:
    """``_codecs.encode`` as protocol-2 pickles use it for ``bytes``.

    Only the latin-1 codec: a codec name is a module import.
    """
    if encoding not in ('latin1', 'latin-1'):
        raise pickle.UnpicklingError(
            f'checkpoint asks for _codecs.encode(..., {encoding!r})')
    return text.encode('latin1')


_NUMPY_GLOBALS = _numpy_globals()
RUNNER_CHECKPOINT_TYPES = (HistoryBuffer, argparse.Namespace, *dict.fromkeys(
    _NUMPY_GLOBALS.values()))


def _restricted_globals() -> Dict[str, Any]:
    """The complete allow-list of the ``'restricted'`` mode, by pickle name."""
    allowed: Dict[str, Any] = {}
    try:  # torch's own weights-only list (private, present since torch 1.13)
        from torch._weights_only_unpickler import _get_allowed_globals
        allowed.update(_get_allowed_globals())
    except ImportError:
        pass
    allowed.update({
        'collections.OrderedDict': collections.OrderedDict,
        'collections.Counter': collections.Counter,  # in mmdet checkpoints
        'torch.Size': torch.Size,
        'torch.Tensor': torch.Tensor,
        'torch.nn.parameter.Parameter': torch.nn.Parameter,
        'torch.device': torch.device,
        'torch._utils._rebuild_tensor': torch._utils._rebuild_tensor,
        'torch._utils._rebuild_tensor_v2': torch._utils._rebuild_tensor_v2,
        'torch._utils._rebuild_parameter': torch._utils._rebuild_parameter,
        'builtins.set': set,
        'builtins.frozenset': frozenset,
        'builtins.bytearray': bytearray,
        'builtins.complex': complex,
        'builtins.slice': slice,
        '_codecs.encode': latin1_encode,
        'builtins.getattr': history_buffer_getattr,
        'mmengine.logging.history_buffer.HistoryBuffer': HistoryBuffer,
        'argparse.Namespace': argparse.Namespace,  # a training script's args
    })
    for value in vars(torch).values():  # dtypes and layouts are plain data
        if isinstance(value, (torch.dtype, torch.layout)):
            allowed[str(value)] = value
    allowed.update(_NUMPY_GLOBALS)
    return allowed


_ALLOWED = _restricted_globals()


def _refuse(module: str, name: str) -> pickle.UnpicklingError:
    return pickle.UnpicklingError(
        f'Weights only load failed: unsupported GLOBAL {module}.{name} '
        '(clustr_mm restricted unpickler: only tensors, containers and '
        'allow-listed data types are loaded).')


class RestrictedUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that resolves only allow-listed globals."""

    def find_class(self, module: str, name: str):
        # Protocol-2 pickles (torch.save's) use Python 2 names such as
        # __builtin__.getattr; map them as pickle itself does.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        try:
            return _ALLOWED[f'{module}.{name}']
        except KeyError:
            raise _refuse(module, name) from None


def _restricted_load(file, **kwargs):
    return RestrictedUnpickler(file, **kwargs).load()


#: A ``pickle_module`` for ``torch.load`` (it needs ``Unpickler`` and ``load``).
restricted_pickle = types.SimpleNamespace(
    __name__='clustr_mm.restricted_pickle', Unpickler=RestrictedUnpickler,
    load=_restricted_load)

#: ``'native'`` or ``'restricted'``; set by :func:`allow_runner_checkpoint_types`.
MODE: Optional[str] = None


def _probe_checkpoint() -> bytes:
    buf = io.BytesIO()
    hub = HistoryBuffer()
    hub.update(1.5)
    torch.save({'state_dict': {'w': torch.ones(2)}, 'hub': hub,
                'arr': np.arange(3, dtype=np.int64)}, buf)
    return buf.getvalue()


def _native_supported() -> bool:
    """Register the allow-list with torch if torch can express it.

    Returns False (leaving torch's global list as it was) where
    ``add_safe_globals`` is missing or cannot take ``(obj, name)`` pairs.
    """
    ser = torch.serialization
    if not all(hasattr(ser, f) for f in ('add_safe_globals', 'get_safe_globals',
                                          'clear_safe_globals')):
        return False
    before = list(ser.get_safe_globals())
    entries = [HistoryBuffer, argparse.Namespace,
               (history_buffer_getattr, 'builtins.getattr')]
    for full_name, obj in _NUMPY_GLOBALS.items():
        entries.append((obj, full_name))
    try:
        ser.add_safe_globals(entries)
        loaded = torch.load(io.BytesIO(_probe_checkpoint()), weights_only=True)
        ok = (isinstance(loaded['hub'], HistoryBuffer)
              and loaded['hub'].current() == 1.5
              and loaded['arr'].tolist() == [0, 1, 2])
    except Exception:  # noqa: BLE001  (any failure: torch cannot do it)
        ok = False
    if not ok:
        ser.clear_safe_globals()
        if before:
            ser.add_safe_globals(before)
    return ok


def safe_load(f, map_location=None) -> Any:
    """``torch.load`` of a file or buffer without running code from it.

    Refused globals raise :class:`pickle.UnpicklingError` whose message
    contains ``GLOBAL module.name``.
    """
    if MODE is None:
        allow_runner_checkpoint_types()
    if MODE == 'native':
        return torch.load(f, map_location=map_location, weights_only=True)
    return restricted_load(f, map_location)


def restricted_load(f, map_location=None) -> Any:
    """The ``'restricted'`` mode's load, usable on every torch (for tests)."""
    return torch.load(f, map_location=map_location, weights_only=False,
                      pickle_module=restricted_pickle)


def allow_runner_checkpoint_types() -> str:
    """Make weights-only loading accept MMEngine runner checkpoints.

    Idempotent. Returns the mode (``'native'`` or ``'restricted'``).
    """
    global MODE
    if MODE is None:
        forced = os.environ.get('CLUSTR_MM_SAFE_LOAD', '')
        if forced not in ('', 'restricted'):
            raise ValueError(f'CLUSTR_MM_SAFE_LOAD={forced!r}: only '
                             "'restricted' (force the fallback) is known")
        native = not forced and _native_supported()
        MODE = 'native' if native else 'restricted'
    return MODE

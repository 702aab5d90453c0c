"""Refuse unsupported environments with one clear message.

An unsupported stack otherwise fails deep inside a library (a missing torch
API, ``No module named 'mmcv._ext'``, numpy ABI errors). These checks name the
package, the version found and the version needed instead. They read versions
from the installed distributions' metadata and test behaviour (numpy
interoperability, compiled mmcv ops) rather than assume it from a version.

* :func:`check_core` runs when ``clustr_mm`` is imported: Python, torch,
  mmengine, numpy.
* :func:`check_scope` runs when the tools load a config, and, through
  :func:`install_scope_check`, when MMEngine
  first imports a task library's modules for a config's ``default_scope``
  (``mmdet``, ``mmseg``, ``mmpose``, ``mmpretrain``), i.e. before the library's
  own imports can fail: detection, segmentation and pose models need mmcv with
  compiled ops (``mmcv._ext``) and mmcv < 2.2; and the library must import
  (MMEngine would hide a missing dependency of it behind a registry KeyError).

Self-contained on purpose (standard library only at import time), so it can
run before anything that might break on an unsupported stack.
"""
import importlib
import importlib.metadata
import importlib.util
import re
import sys
from typing import List, Optional, Tuple

#: What the code needs, mirrored by setup.py's requirements and extras.
PYTHON = ((3, 9), None)
CORE = {
    'torch': ('2.0', None),
    'mmengine': ('0.8', '1.0'),
}
#: mmcv range of mmdet 3.3 / mmseg 1.2 / mmpose 1.3 (they assert < 2.2.0).
MMCV_FOR_TASKS = ('2.0.0rc4', '2.2.0')
#: Task libraries: (distribution, lower bound tested with, needs mmcv ops).
TASK_LIBS = {
    'mmdet': ('mmdet', '3.3.0', True),
    'mmseg': ('mmsegmentation', '1.2.2', True),
    'mmpose': ('mmpose', '1.3.2', True),
    'mmpretrain': ('mmpretrain', '1.2.0', False),
}


class UnsupportedEnvironmentError(ImportError):
    """The installed stack cannot run clustr_mm (message says what to fix)."""


def parse_version(text: str) -> Tuple[int, ...]:
    """``'2.1.2+cu121'`` -> (2, 1, 2, 0, 0); ``'2.0.0rc4'`` -> (2, 0, 0, -1, 4).

    Pre-releases (a, b, rc, dev) sort before their release; local suffixes
    (``+cu121``) are ignored.
    """
    m = re.match(r'\s*v?(\d+(?:\.\d+)*)(?:[.-]?(a|b|rc|dev|alpha|beta)\.?(\d*))?',
                 text)
    if not m:
        raise ValueError(f'cannot parse version {text!r}')
    release = [int(p) for p in m.group(1).split('.')]
    release += [0] * (3 - len(release))
    pre = (-1, int(m.group(3) or 0)) if m.group(2) else (0, 0)
    return tuple(release) + pre


def installed_version(dist: str) -> Optional[str]:
    """Version of an installed distribution, or None if it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    # A source / conda build without pip metadata: ask the module itself.
    module = {'mmsegmentation': 'mmseg'}.get(dist, dist)
    if importlib.util.find_spec(module) is None:
        return None
    return getattr(importlib.import_module(module), '__version__', None)


def require(package: str, found: Optional[str], minimum: Optional[str],
            below: Optional[str] = None, why: str = '') -> None:
    """Raise :class:`UnsupportedEnvironmentError` unless
    ``minimum <= found < below``."""
    wanted = ' and '.join(
        p for p in ((f'>= {minimum}' if minimum else ''),
                    (f'< {below}' if below else '')) if p)
    if found is None:
        raise UnsupportedEnvironmentError(
            f'clustr_mm needs {package} {wanted}, but {package} is not '
            f'installed.{" " + why if why else ""}')
    ok = ((minimum is None or parse_version(found) >= parse_version(minimum))
          and (below is None or parse_version(found) < parse_version(below)))
    if not ok:
        raise UnsupportedEnvironmentError(
            f'clustr_mm needs {package} {wanted}, found {package} {found}.'
            f'{" " + why if why else ""} See docs/environments.md for the '
            'supported stacks.')


def check_core() -> None:
    """Python, torch, mmengine and numpy; run when clustr_mm is imported."""
    (minimum, _) = PYTHON
    if sys.version_info[:2] < minimum:
        raise UnsupportedEnvironmentError(
            f'clustr_mm needs Python >= {minimum[0]}.{minimum[1]}, found '
            f'Python {sys.version.split()[0]}.')
    for dist, (minimum, below) in CORE.items():
        require(dist, installed_version(dist), minimum, below)
    check_numpy_torch()


def check_numpy_torch() -> None:
    """numpy must be importable by the installed torch's binary.

    torch < 2.3 is compiled against numpy 1.x and cannot exchange arrays with
    numpy 2 (a warning at import, then ``RuntimeError: Numpy is not
    available``), which breaks data loading and checkpoints.
    """
    import warnings

    import numpy as np
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        try:
            works = torch.from_numpy(np.arange(3)).tolist() == [0, 1, 2]
        except (RuntimeError, TypeError, ValueError):
            works = False
    if not works:
        raise UnsupportedEnvironmentError(
            f'torch {torch.__version__} cannot use numpy {np.__version__} '
            '(torch < 2.3 is built against numpy 1.x): clustr_mm needs '
            "numpy < 2 with this torch ('pip install \"numpy<2\"').")


def has_mmcv_ops() -> bool:
    """Whether mmcv's compiled extension (``mmcv._ext``) is installed."""
    try:
        return importlib.util.find_spec('mmcv._ext') is not None
    except (ImportError, ValueError):
        return False


def check_scope(scope: str) -> None:
    """The task library of ``scope`` and the mmcv it needs."""
    if scope not in TASK_LIBS:
        return
    dist, minimum, needs_ops = TASK_LIBS[scope]
    require(dist, installed_version(dist), minimum,
            why=f'Configs with default_scope={scope!r} need it.')
    if needs_ops:
        check_mmcv_ops(dist)
    import_scope(scope, dist)


def check_mmcv_ops(dist: str) -> None:
    """mmcv in the task libraries' range, with its compiled ops."""
    mmcv = installed_version('mmcv')
    why = (f'{dist} {installed_version(dist)} models import mmcv.ops; '
           "install the full 'mmcv' package (not mmcv-lite).")
    require('mmcv', mmcv, *MMCV_FOR_TASKS, why=why)
    if not has_mmcv_ops():
        raise UnsupportedEnvironmentError(
            f'clustr_mm: {dist} {installed_version(dist)} models need mmcv '
            'with compiled ops '
            f"(mmcv._ext), found mmcv {mmcv} without them (mmcv-lite, or "
            'built without MMCV_WITH_OPS=1). Install a prebuilt mmcv '
            f'{mmcv} wheel for torch {installed_version("torch")}, or build '
            'it: MMCV_WITH_OPS=1 pip install --no-build-isolation '
            f'mmcv=={mmcv} (tools/setup_env.sh does this).')


def import_scope(scope: str, dist: str) -> None:
    """Import ``scope.utils`` as MMEngine will, but loudly: MMEngine turns
    an ImportError anywhere inside it (a missing dependency such as
    mmpretrain's ``modelindex``) into a '... is not installed' warning and a
    later registry KeyError that never names the missing module."""
    try:
        importlib.import_module(f'{scope}.utils')
    except ImportError as err:
        raise UnsupportedEnvironmentError(
            f'clustr_mm: {dist} {installed_version(dist)} is installed but '
            f'does not import ({type(err).__name__}: {err}); configs with '
            f'default_scope={scope!r} need it. Install the missing package '
            '(tools/setup_env.sh installs the whole stack).') from err


def location_failure(scope: str, name: str, locations: List[str],
                     err: Exception) -> str:
    """The message for a registry whose modules do not import: seen with
    mmpretrain 1.2.0's multimodal models under a transformers it does not
    support (a bare ``TypeError: NoneType takes no arguments``)."""
    where = ', '.join(locations) or f'{scope}.utils'
    dist = TASK_LIBS[scope][0] if scope in TASK_LIBS else scope
    version = installed_version(dist)
    lib = f'{dist} {version}' if version else dist
    return (f'clustr_mm: the modules of the {scope!r} {name} registry '
            f'({where}) do not import: {type(err).__name__}: {err}. {lib} '
            'or a package it imports is broken or a version it does not '
            'support; the traceback above names the file (tools/setup_env.sh '
            'installs a stack that imports).')


def install_scope_check() -> None:
    """Run :func:`check_scope` before MMEngine imports a scope's modules.

    Wraps ``mmengine.registry.Registry.import_from_location`` once; that is
    where a config's ``default_scope`` library gets imported (and where a
    missing ``mmcv._ext`` would otherwise surface as a bare
    ``ModuleNotFoundError``). Any other failure to import the registry's
    modules is raised as :class:`UnsupportedEnvironmentError` naming the
    scope and the error (:func:`location_failure`).
    """
    from mmengine.registry import Registry
    original = Registry.import_from_location
    if getattr(original, '_clustr_mm_checked', False):
        return

    def import_from_location(self):
        if self._imported:
            return original(self)
        check_scope(self.scope)
        try:
            return original(self)
        except UnsupportedEnvironmentError:
            raise
        except Exception as err:
            raise UnsupportedEnvironmentError(
                location_failure(self.scope, self.name,
                                 list(self._locations), err)) from err

    import_from_location._clustr_mm_checked = True
    import_from_location.__wrapped__ = original
    import_from_location.__doc__ = original.__doc__
    Registry.import_from_location = import_from_location

"""A fast backend's first use on a device, checked against an oracle
backend: a kernel that is wrong on a user's GPU must not silently train
another model.

:class:`Checked` wraps two backends through their public interface (the
dispatch wraps the fused one, with the blocked one as the oracle). The
first time the fast backend's own code runs in a process for a window
shape class, the same windows also go through the oracle, and the
two are compared (:func:`.agreement.compare`: k nearest distances,
densities, distance to the nearest denser token within the derived
round-off bound; ids equal except the reference's near-ties). If they
disagree, a warning (once per backend and device) gives the device, its
compute capability, the torch and Triton versions and the measured
difference, and the oracle clusters in that backend's place on that device
for the rest of the process.

Switches (environment, read at each first use, parsed by
:func:`clustr_mm.registry.switch`: 1/on/true/yes, 0/off/false/no, anything
else refused): ``CLUSTR_MM_FUSED_CHECK=0`` turns the check off;
``CLUSTR_MM_FUSED_CHECK_STRICT=1`` makes a disagreement an error (CI).

Shape class: (fast backend, device, precision, tokens per window,
channels, whether windows are padded): one check per backend and stage
size of a model, so a forward at a
new input size checks its new windows once. Cost: on each first use, one
oracle clustering of the same windows, the comparison (a few passes over
the (G, n, k) and (G, n, K) values) and a few host syncs; afterwards one
dict lookup per call. The check runs eagerly only: while tracing or
compiling (``torch.compile``, ``torch.jit.trace``) or capturing a CUDA
graph the op runs unchecked (an eager first use, e.g. a warm-up forward,
checks it).
"""
import sys
import threading
import warnings
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

import torch

from ...graph_safety import is_tracing
from ...registry import switch
from .agreement import compare
from .common import ClusteringPlan, Task, Windows

OFF_ENV = 'CLUSTR_MM_FUSED_CHECK'
STRICT_ENV = 'CLUSTR_MM_FUSED_CHECK_STRICT'
REPORT_TO = ("clustr_mm's issue tracker, with this message and the output "
             'of `python -m torch.utils.collect_env`')


class ShapeClass(NamedTuple):
    """What one check covers (see the module docstring)."""
    backend: str
    device: str
    precision: str
    tokens: int
    channels: int
    padded: bool


_lock = threading.Lock()
_reports: Dict[ShapeClass, dict] = {}  # shape class -> compare() report
# (fast backend, device) -> the warning given
_fallen_back: Dict[Tuple[str, str], str] = {}


class FusedCheckError(RuntimeError):
    """The fast backend disagreed with its oracle (strict mode)."""


def _device_key(device: torch.device) -> str:
    if device.type == 'cuda':
        index = (device.index if device.index is not None else
                 torch.cuda.current_device())
        return f'cuda:{index}'
    return str(device)


def shape_class(backend: str, x: torch.Tensor, windows: Windows,
                precision: str) -> ShapeClass:
    """The shape class of ``x``'s windows for the fast backend named
    ``backend``."""
    return ShapeClass(backend, _device_key(x.device), precision, x.shape[1],
                      x.shape[2], windows.invalid is not None)


def check_reports() -> Dict[ShapeClass, dict]:
    """The comparisons made so far, per shape class (a copy)."""
    with _lock:
        return dict(_reports)


def reset() -> None:
    """Forget the checks and fallbacks of this process (tests)."""
    with _lock:
        _reports.clear()
        _fallen_back.clear()
        _other_checks.clear()


def _enabled() -> bool:
    return switch(OFF_ENV, True)


def _strict() -> bool:
    return switch(STRICT_ENV, False)


def _capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


def describe_device(device: torch.device) -> str:
    """Device name, compute capability, torch and Triton versions."""
    if device.type == 'cuda':
        name = torch.cuda.get_device_name(device)
        major, minor = torch.cuda.get_device_capability(device)
        where = f'{name} (compute capability {major}.{minor})'
    else:
        where = f'{device} (Triton interpreter)'
    # the Triton the kernels run with, imported by the fast backend
    triton_v = getattr(sys.modules.get('triton'), '__version__', None)
    return f'{where}, torch {torch.__version__}, triton {triton_v}'


def _message(x: torch.Tensor, key: ShapeClass, report: dict,
             oracle: str) -> str:
    diff = ', '.join(
        f'{name} {report[name]:.3g}x its bound' for name in
        ('knn', 'rho', 'delta2')) + (
        f"; {report['center_mismatches']} centers and "
        f"{report['unexplained_ids']} ids differ beyond near-ties "
        f"({report['id_mismatches']} ids differ in all)")
    return (f'clustr_mm: the {key.backend} DPC-kNN kernels disagree with '
            f'the {oracle} path on {describe_device(x.device)}, windows of '
            f'{key.tokens} tokens x {key.channels} channels, precision '
            f'{key.precision!r}: {diff}. ClusTR clusters with the {oracle} '
            f'path instead of the {key.backend} one on {key.device} for the '
            f'rest of this process (slower, same algorithm). Please '
            f'report it to {REPORT_TO}. {OFF_ENV}=0 skips this check; '
            f'{STRICT_ENV}=1 makes it an error.')


class Checked:
    """``fast`` (a backend with ``runs_kernels(x)`` and ``probed(...)``
    beside the backend interface) checked against ``oracle`` on first use
    (module docstring); itself a backend under ``fast``'s name."""

    def __init__(self, fast, oracle):
        self.fast, self.oracle = fast, oracle
        self.NAME = fast.NAME
        self.HOLDS_BLOCKS = fast.HOLDS_BLOCKS

    def why_not(self, task: Task) -> Optional[str]:
        return self.fast.why_not(task)

    def run(self, x: torch.Tensor, counts: Sequence[int], k: int,
            windows: Windows, plan: ClusteringPlan) -> torch.Tensor:
        """``fast.run``, checked on first use; ``oracle.run`` under the
        same plan on a device where the check failed."""
        fast, oracle = self.fast, self.oracle
        if not fast.runs_kernels(x):
            return fast.run(x, counts, k, windows, plan)
        tracing = is_tracing()
        device = None if tracing else (fast.NAME, _device_key(x.device))
        if device is not None and device in _fallen_back:
            return oracle.run(x, counts, k, windows, plan)
        if tracing or _capturing(x) or not _enabled():
            return fast.run(x, counts, k, windows, plan)
        key = shape_class(fast.NAME, x, windows, plan.precision)
        if key in _reports:
            return fast.run(x, counts, k, windows, plan)
        ids, got = fast.probed(x, counts, k, windows, plan)
        ref_ids, ref = oracle.probed(x, counts, k, windows, plan)
        report = compare(x, counts, windows, ref, got, ref_ids, ids,
                         plan.precision)
        with _lock:
            _reports[key] = report
        if report['agree']:
            # the same kernels again, through the op: every call is the op
            # (the op census and torch.compile see one op per call)
            return fast.run(x, counts, k, windows, plan)
        message = _message(x, key, report, oracle.NAME)
        if _strict():
            raise FusedCheckError(message)
        with _lock:
            first = device not in _fallen_back
            _fallen_back[device] = message
        if first:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return ref_ids


# (kernel name, device, what else fixes the code path) -> None where the
# kernels agreed, else the warning given (the oracle runs from then on)
_other_checks: Dict[tuple, Optional[str]] = {}


def checked_once(kernel: str, x: torch.Tensor, key: tuple, fast, oracle,
                 disagreement):
    """``fast()``, checked against ``oracle()`` the first time per
    ``(kernel, device) + key`` in this process, as :class:`Checked` checks
    the fused DPC-kNN (same switches, warning and fallback; for kernels
    without a backend of their own, e.g. the merge of :mod:`.merge`):
    ``disagreement(got, ref)`` is None where they agree, else what differs.
    On a device where a check failed ``oracle()`` runs instead."""
    device = _device_key(x.device)
    if is_tracing() or _capturing(x) or not _enabled():
        return fast()
    with _lock:
        fallen = any(k[:2] == (kernel, device) and v is not None
                     for k, v in _other_checks.items())
        known = (kernel, device) + key in _other_checks
    if fallen:
        return oracle()
    if known:
        return fast()
    got, ref = fast(), oracle()
    diff = disagreement(got, ref)
    message = None if diff is None else (
        f'clustr_mm: the {kernel} kernels disagree with torch on '
        f'{describe_device(x.device)} ({key}): {diff}. ClusTR runs the '
        f'torch code in their place on {device} for the rest of this '
        f'process (slower, same result). Please report it to {REPORT_TO}. '
        f'{OFF_ENV}=0 skips this check; {STRICT_ENV}=1 makes it an error.')
    if message is not None and _strict():
        raise FusedCheckError(message)
    with _lock:
        _other_checks[(kernel, device) + key] = message
    if message is not None:
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return ref
    return got

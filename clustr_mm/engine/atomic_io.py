"""Atomic local writes for MMEngine's file backend (checkpoints, pointers).

MMEngine writes a checkpoint by opening its final path and writing the bytes.
A run killed in the middle (preemption, OOM) leaves a truncated
``epoch_N.pth`` behind, which a later ``--resume`` trips over. Writes through
this backend go to a temporary file in the same directory, are flushed to
disk, and then renamed over the final name, so a file at the final path is
always complete.

The temporary file gets the mode a plain ``open`` would give (``0o666`` less
the umask, as MMEngine's own writes), not ``mkstemp``'s private 0600. A
SIGTERM arriving during the write (the default action kills the process
without any clean-up) removes the temporary file, then ends the process as
the signal would have; files left by a SIGKILL are swept at the next start
(:func:`sweep_stale_temporaries`).
"""
import contextlib
import os
import os.path as osp
import re
import signal
import tempfile
import threading

from mmengine.fileio import LocalBackend, register_backend
from mmengine.fileio import io as mm_io


# .<final name>.<pid>.<random>.tmp
_TEMPORARY = re.compile(r'\.(.+)\.(\d+)\.[^.]+\.tmp')


class _Terminated(BaseException):
    """SIGTERM arrived while a temporary file existed."""


def _raise_terminated(signum, frame):
    raise _Terminated


@contextlib.contextmanager
def _sigterm_raises():
    """Turn SIGTERM into an exception while the default action is in force
    (a handler set by someone else, or ignoring it, is left alone); on the
    way out the signal is delivered again under the default action."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise  # not reached: the default action ends the process
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(filepath, data: bytes) -> None:
    """Write ``data`` to ``filepath`` so that readers see all of it or none."""
    directory = osp.dirname(osp.abspath(filepath))
    os.makedirs(directory, exist_ok=True)
    with _sigterm_raises():
        fd, tmp = tempfile.mkstemp(
            dir=directory, suffix='.tmp',
            prefix=f'.{osp.basename(filepath)}.{os.getpid()}.')
        try:
            with os.fdopen(fd, 'wb') as f:
                os.fchmod(f.fileno(), 0o666 & ~_umask())
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, filepath)
        except BaseException:
            if osp.exists(tmp):
                os.remove(tmp)
            raise


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def sweep_stale_temporaries(directory) -> list:
    """Delete the temporary files of writes whose process has died (killed
    by SIGKILL or a power cut mid-save) in ``directory``; returns their
    paths. Files of live processes on this machine are kept."""
    removed = []
    if not osp.isdir(directory):
        return removed
    for name in sorted(os.listdir(directory)):
        match = _TEMPORARY.fullmatch(name)
        if match and not _alive(int(match.group(2))):
            path = osp.join(directory, name)
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
                removed.append(path)
    return removed


class AtomicLocalBackend(LocalBackend):
    """MMEngine's local backend with atomic ``put`` and ``put_text``."""

    def put(self, obj: bytes, filepath) -> None:
        atomic_write(filepath, obj)

    def put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
        atomic_write(filepath, obj.encode(encoding))


def use_atomic_local_writes() -> None:
    """Make every local MMEngine file write atomic (idempotent)."""
    register_backend('local', AtomicLocalBackend, force=True, prefixes='')
    # Drop cached instances of the plain backend created before this call.
    for key in [k for k, v in mm_io.backend_instances.items()
                if type(v) is LocalBackend]:
        del mm_io.backend_instances[key]

"""Atomic local writes for MMEngine's file backend (checkpoints, pointers).

MMEngine writes a checkpoint by opening its final path and writing the bytes.
A run killed in the middle (preemption, OOM) leaves a truncated
``epoch_N.pth`` behind, which a later ``--resume`` trips over. Writes through
this backend go to a temporary file in the same directory, are flushed to
disk, and then renamed over the final name, so a file at the final path is
always complete.
"""
import os
import os.path as osp
import tempfile

from mmengine.fileio import LocalBackend, register_backend
from mmengine.fileio import io as mm_io


def atomic_write(filepath, data: bytes) -> None:
    """Write ``data`` to ``filepath`` so that readers see all of it or none."""
    directory = osp.dirname(osp.abspath(filepath))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory,
                               prefix=f'.{osp.basename(filepath)}.', suffix='.tmp')
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, filepath)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise


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

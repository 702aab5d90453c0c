"""Let torch's weights-only unpickler read MMEngine runner checkpoints.

torch >= 2.6 loads with ``weights_only=True``: only tensors, containers and
allow-listed classes are rebuilt, so a checkpoint cannot run code. MMEngine
0.10.7 runner checkpoints also pickle the message hub (``HistoryBuffer``
objects holding numpy arrays), which the default allow-list refuses, so
``--resume`` breaks. Instead of turning the protection off for every load, we
add exactly the few data-only types those checkpoints contain. Any other global
in a pickle is still refused.

``HistoryBuffer`` pickles its statistics methods as
``getattr(HistoryBuffer, 'mean')``. Allowing ``builtins.getattr`` itself would
let a crafted pickle walk from any allowed object to arbitrary code, so we
allow, under that name, a getattr that resolves only those methods.
"""
import pickle

import numpy as np
import torch
from mmengine.logging import HistoryBuffer


def _numpy_types():
    types = [np.ndarray, np.dtype, np.core.multiarray._reconstruct,
             np.core.multiarray.scalar]
    # numpy >= 1.25 pickles dtypes as instances of per-type classes.
    types += [type(np.dtype(t)) for t in (
        np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
        np.uint32, np.uint64,
        np.float16, np.float32, np.float64)]
    return types


def history_buffer_getattr(obj, name: str):
    """``getattr`` restricted to HistoryBuffer's public statistics methods."""
    if obj is HistoryBuffer and name in ('min', 'max', 'current', 'mean'):
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'checkpoint asks for getattr({obj!r}, {name!r}); only '
        'HistoryBuffer statistics methods are allowed')


RUNNER_CHECKPOINT_TYPES = (HistoryBuffer, *_numpy_types())


def allow_runner_checkpoint_types() -> None:
    """Allow-list the data-only types of MMEngine runner checkpoints."""
    torch.serialization.add_safe_globals(
        [*RUNNER_CHECKPOINT_TYPES,
         (history_buffer_getattr, 'builtins.getattr')])

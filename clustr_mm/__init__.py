"""clustr_mm: clustering-attention vision backbones for the OpenMMLab stack.

Importing the package registers every backbone in MMEngine's root ``MODELS``
registry, so configs of mmpretrain, mmdet, mmseg and mmpose can build them by
their plain names (``type='ClusTR'``), lets torch's weights-only loader read
MMEngine runner checkpoints (for ``--resume``), and makes MMEngine's local
checkpoint writes atomic (a killed run never leaves a truncated checkpoint).
"""
__version__ = '0.1.0'

from .env_check import check_core, install_scope_check  # noqa: E402

check_core()  # Python, torch, mmengine, numpy: a clear error, not a traceback
install_scope_check()  # mmdet/mmseg/mmpose configs: mmcv with compiled ops

from . import engine, models  # noqa: E402,F401  (registers hooks, models)
from .checkpoints.safe_pickle import allow_runner_checkpoint_types  # noqa: E402
from .engine.atomic_io import use_atomic_local_writes  # noqa: E402

allow_runner_checkpoint_types()
use_atomic_local_writes()

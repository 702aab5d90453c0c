"""clustr_mm: clustering-attention vision backbones for the OpenMMLab stack.

Importing the package registers every backbone in MMEngine's root ``MODELS``
registry, so configs of mmpretrain, mmdet, mmseg and mmpose can build them by
their plain names (``type='ClusTR'``), makes MMEngine's checkpoint loading
safe (weights-only, runner checkpoints included), URL downloads cached by the
whole URL, official PaCa-ViT files converted on load (clustr_mm.checkpoints),
and makes MMEngine's local checkpoint writes atomic (a killed run never leaves
a truncated checkpoint). README, "What importing clustr_mm changes", lists
every such change; ``CLUSTR_MM_SKIP`` leaves them out (``registry.py``).
"""
__version__ = '0.1.0'

from .env_check import check_core, install_scope_check  # noqa: E402
from .registry import change_wanted  # noqa: E402

check_core()  # Python, torch, mmengine, numpy: a clear error, not a traceback
if change_wanted('scope_check'):
    install_scope_check()  # mmdet/mmseg/mmpose configs: mmcv with compiled ops

from . import engine, models  # noqa: E402,F401  (registers hooks, models)
from .checkpoints import install_checkpoint_loaders  # noqa: E402
from .engine.atomic_io import use_atomic_local_writes  # noqa: E402
from .engine.compile import keep_optimizer_steps_eager  # noqa: E402

if change_wanted('checkpoint_loaders'):
    install_checkpoint_loaders()
if change_wanted('atomic_writes'):
    use_atomic_local_writes()
if change_wanted('eager_optimizer_step'):
    keep_optimizer_steps_eager()  # MMEngine's `compile` option

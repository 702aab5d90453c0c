"""clustr_mm: clustering-attention vision backbones for the OpenMMLab stack.

Importing the package registers every backbone in MMEngine's root ``MODELS``
registry, so configs of mmpretrain, mmdet, mmseg and mmpose can build them by
their plain names (``type='ClusTR'``), and lets torch's weights-only loader
read MMEngine runner checkpoints (for ``--resume``).
"""
__version__ = '0.1.0'

from . import models  # noqa: E402,F401  (registers the models)
from .utils import allow_runner_checkpoint_types  # noqa: E402

allow_runner_checkpoint_types()

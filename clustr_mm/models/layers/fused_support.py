"""Whether the fused clustering (:mod:`~.dpc_knn_fused`) can run here.

Apart from the kernels, so that the device plans (:mod:`~.window_layout`)
can ask without importing the op, which itself builds on the window
constants of :mod:`~.window_layout`.
"""
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only builds of torch, or no triton
    triton = tl = None

HAS_CUSTOM_OP = hasattr(torch.library, 'custom_op')
# Triton's interpreter runs the kernels on the CPU (tests); it must be on
# before the kernels are defined.
INTERPRET = os.environ.get('TRITON_INTERPRET') == '1'


def fused_available() -> bool:
    """Whether the fused op can run on a CUDA device here."""
    return (triton is not None and HAS_CUSTOM_OP
            and torch.cuda.is_available())

"""Ops with their own kernels, dispatch and first-use check, beside the
layers that use them (as ``mmcv.ops``): :mod:`.dpc_knn`, ClusTR's
clustering."""

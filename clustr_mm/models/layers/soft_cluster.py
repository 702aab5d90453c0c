"""PaCa-ViT's learned soft clustering and patch-to-cluster attention.

Kept as the historical import path: the soft clustering is the registered
reducer :class:`~.reducers.SoftCluster` (its maths lives in ``reducers.py``)
and PaCa's attention is a named setting of the shared attention
(:class:`~.cluster_attention.PaCaAttention`).
"""
from .cluster_attention import PaCaAttention
from .reducers import (PointwiseConv, SoftCluster, apply_assignment,
                       soft_assignment)

__all__ = ['PaCaAttention', 'PointwiseConv', 'SoftCluster',
           'apply_assignment', 'soft_assignment']

"""Necks of our own (no OpenMMLab library needed: registered on import)."""
from .aggregation import MultiStageAggregation, PooledAttentionBlock

__all__ = ['MultiStageAggregation', 'PooledAttentionBlock']

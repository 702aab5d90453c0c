from .attention import multi_head_attention, split_heads
from .drop_path import DropPath
from .cluster_attention import ClusterAttention
from .ffn import ConvFFN
from .patch_embed import OverlapPatchEmbed
from .soft_cluster import (ConvClusterLogits, MlpClusterLogits, PaCaAttention,
                           PointwiseConv, soft_assignment)
from .token_clustering import (DPCKNNClustering, WindowLayout, dpc_knn_assign,
                               merge_tokens)

__all__ = [
    'multi_head_attention', 'split_heads', 'DropPath', 'ConvFFN',
    'ClusterAttention', 'OverlapPatchEmbed', 'DPCKNNClustering',
    'WindowLayout', 'dpc_knn_assign', 'merge_tokens', 'ConvClusterLogits',
    'MlpClusterLogits', 'PaCaAttention', 'PointwiseConv', 'soft_assignment'
]

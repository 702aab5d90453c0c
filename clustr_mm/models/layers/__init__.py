from .attention import multi_head_attention, split_heads
from .drop_path import DropPath
from .cluster_attention import (ClusterAttention, PaCaAttention,
                                SummaryAttention)
from .ffn import ConvFFN
from .patch_embed import OverlapPatchEmbed, tokens_to_map
from .reducers import (DPCKNN, CentroidAttention, GridPool, PointwiseConv,
                       Reduction, SoftCluster, TokenReducer, apply_assignment,
                       assignment_map, build_reducer, soft_assignment)
from .token_clustering import DPCKNNClustering, dpc_knn_assign, merge_tokens
from .window_layout import ClusteringPlan, WindowLayout, plan_for

__all__ = [
    'multi_head_attention', 'split_heads', 'DropPath', 'ConvFFN',
    'SummaryAttention', 'ClusterAttention', 'PaCaAttention',
    'OverlapPatchEmbed', 'tokens_to_map', 'TokenReducer', 'Reduction',
    'build_reducer', 'apply_assignment', 'assignment_map', 'DPCKNN',
    'SoftCluster', 'CentroidAttention', 'GridPool', 'DPCKNNClustering',
    'WindowLayout', 'dpc_knn_assign', 'merge_tokens', 'PointwiseConv',
    'soft_assignment', 'ClusteringPlan', 'plan_for'
]

from .attention import multi_head_attention, split_heads
from .drop_path import DropPath
from .cluster_attention import (ClusterAttention, PaCaAttention,
                                SummaryAttention)
from .dpc_knn import DPCKNN, merge_clusters, use_plan
from .ffn import ConvFFN
from .patch_embed import OverlapPatchEmbed, tokens_to_map
from .reducers import (AvgGridPool, CentroidAttention, GridPool,
                       PointwiseConv, SoftCluster, soft_assignment)
from .token_reducer import (Reduction, TokenReducer, apply_assignment,
                            assignment_map, build_reducer, reducer_class)

__all__ = [
    'multi_head_attention', 'split_heads', 'DropPath', 'ConvFFN',
    'SummaryAttention', 'ClusterAttention', 'PaCaAttention',
    'OverlapPatchEmbed', 'tokens_to_map', 'TokenReducer', 'Reduction',
    'build_reducer', 'reducer_class', 'apply_assignment', 'assignment_map',
    'DPCKNN', 'SoftCluster', 'CentroidAttention', 'GridPool', 'AvgGridPool',
    'merge_clusters', 'use_plan', 'PointwiseConv', 'soft_assignment'
]

"""ClusTR's attention: queries from every token, keys/values from clusters."""
from typing import Optional, Tuple

import torch
from torch import nn

from .attention import multi_head_attention
from .token_clustering import DPCKNNClustering


class ClusterAttention(nn.Module):
    """Multi-scale clustering attention of ClusTR (full attention if sr = 1).

    For ``sr_ratio > 1`` the tokens are clustered by DPC-kNN into two scales
    (``N / sr^2`` and ``4 N / sr^2`` clusters), each cluster token being the
    mean of its members weighted by ``exp(weight_layer(x))``. Each scale has
    its own key/value projection (``kv1`` for the coarse scale, ``kv2`` for the
    fine one); the two attention outputs are summed before ``proj``. Submodule
    names equal the official code's, so checkpoints map one to one.

    Args:
        dim (int): Channels.
        num_heads (int): Heads (all heads attend to every scale).
        sr_ratio (int): Reduction ratio of the stage.
        qkv_bias (bool): Bias of q and kv projections. Default True.
        proj_drop (float): Dropout after ``proj``. Default 0.
        window_size (int, optional): Clustering window (tokens); None for the
            exact per-image clustering. Default None.
        max_chunk_elems (int, optional): Distance-chunk bound of the
            clustering (None: a per-device default).
    """

    def __init__(self, dim: int, num_heads: int, sr_ratio: int,
                 qkv_bias: bool = True, proj_drop: float = 0.0,
                 window_size: Optional[int] = None,
                 max_chunk_elems: Optional[int] = None):
        super().__init__()
        self.num_heads = num_heads
        self.sr_ratio = sr_ratio
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        if sr_ratio > 1:
            self.weight_layer = nn.Linear(dim, 1)
            self.kv1 = nn.Linear(dim, 2 * dim, bias=qkv_bias)
            self.kv2 = nn.Linear(dim, 2 * dim, bias=qkv_bias)
            self.cluster = DPCKNNClustering(
                sr_ratio, (1, 4), window_size=window_size,
                max_chunk_elems=max_chunk_elems)
        else:
            self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """x: (B, H * W, C) tokens of the ``hw`` grid -> (B, H * W, C)."""
        q = self.q(x)
        if self.sr_ratio == 1:
            out = multi_head_attention(q, *self.kv(x).chunk(2, -1),
                                       self.num_heads)
        else:
            w = self.weight_layer(x).exp()
            coarse, fine = self.cluster(x, w, hw)
            out = multi_head_attention(q, *self.kv1(coarse).chunk(2, -1),
                                       self.num_heads)
            out = out + multi_head_attention(q, *self.kv2(fine).chunk(2, -1),
                                             self.num_heads)
        return self.proj_drop(self.proj(out))

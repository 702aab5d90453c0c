"""PaCa-ViT's learned soft clustering and patch-to-cluster attention.

PaCa replaces the N x N token attention by attention from the N patch tokens
to M learned cluster tokens: a small network scores every token for every
cluster, the scores are soft-maxed over the *tokens* (so each cluster token is
a convex combination of all patch tokens), and the normalised cluster tokens
serve as keys and values.
"""
from typing import Optional, Tuple

import torch
from torch import nn

from .attention import multi_head_attention


class PointwiseConv(nn.Linear):
    """A 1x1 convolution applied to (B, N, C) tokens.

    Same maths as ``nn.Conv2d(in, out, 1)`` without an NCHW round trip; its
    weight is (out, in) instead of (out, in, 1, 1). A separate type so that
    weight init can treat it as the convolution it stands for.
    """


class ConvClusterLogits(nn.Module):
    """Clustering logits from a local conv net (the paper's default).

    depthwise kxk conv -> GELU -> 1x1 conv -> GELU -> 1x1 conv to M (no bias).

    Args:
        dim (int): Token channels C.
        num_clusters (int): Number of clusters M.
        kernel_size (int): Depthwise kernel size. Default: 7.
    """

    def __init__(self, dim: int, num_clusters: int, kernel_size: int = 7):
        super().__init__()
        self.dwconv = nn.Conv2d(
            dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        self.pwconv = PointwiseConv(dim, dim)
        self.to_clusters = PointwiseConv(dim, num_clusters, bias=False)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """(B, N, C) tokens of an (H, W) grid -> (B, N, M) logits."""
        b, n, c = x.shape
        # channels-last view, no copy (see ConvFFN for why not transpose)
        grid = x.reshape(b, hw[0], hw[1], c).permute(0, 3, 1, 2)
        h = self.act(self.dwconv(grid)).flatten(2).transpose(1, 2)
        return self.to_clusters(self.act(self.pwconv(h)))


class MlpClusterLogits(nn.Module):
    """Clustering logits from a per-token MLP: Linear, GELU, Linear to M.

    Both linears carry a bias, as in the released checkpoints.
    """

    def __init__(self, dim: int, num_clusters: int, mlp_ratio: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(dim, dim * mlp_ratio)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(dim * mlp_ratio, num_clusters)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """(B, N, C) -> (B, N, M) logits; ``hw`` is unused (no spatial op)."""
        return self.fc2(self.act(self.fc1(x)))


CLUSTER_LOGITS = {'conv': ConvClusterLogits, 'mlp': MlpClusterLogits}


def soft_assignment(logits: torch.Tensor) -> torch.Tensor:
    """(B, N, M) logits -> (B, M, N) assignment, softmax over the N tokens."""
    return logits.transpose(1, 2).softmax(dim=-1)


class PaCaAttention(nn.Module):
    """Patch-to-cluster attention: queries from the N tokens, keys/values from
    M cluster tokens ``Z = LayerNorm(A X)``; plain multi-head self-attention
    when ``num_clusters == 0``.

    A layer either owns a clustering network (``clustering='conv'|'mlp'``) and
    computes the assignment ``A`` from its own input, or (``clustering=None``)
    applies an assignment handed in by an earlier block of its stage or by the
    teacher network, each layer keeping its own cluster LayerNorm.

    Args:
        dim (int): Token channels.
        num_heads (int): Attention heads; must divide ``dim``.
        num_clusters (int): M; 0 for full self-attention.
        clustering (str | None): Own clustering network type, or None to
            reuse an external assignment. Ignored when ``num_clusters == 0``.
        kernel_size (int): Depthwise kernel of the conv clustering. Default: 7.
        mlp_ratio (int): Hidden ratio of the mlp clustering. Default: 4.
    """

    def __init__(self,
                 dim: int,
                 num_heads: int,
                 num_clusters: int,
                 clustering: Optional[str] = None,
                 kernel_size: int = 7,
                 mlp_ratio: int = 4):
        super().__init__()
        if dim % num_heads:
            raise ValueError(
                f'dim {dim} is not divisible by num_heads {num_heads}')
        self.num_heads = num_heads
        self.num_clusters = num_clusters
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.clustering = None
        if num_clusters > 0:
            self.cluster_norm = nn.LayerNorm(dim, eps=1e-6)
            if clustering == 'conv':
                self.clustering = ConvClusterLogits(dim, num_clusters,
                                                    kernel_size)
            elif clustering == 'mlp':
                self.clustering = MlpClusterLogits(dim, num_clusters,
                                                   mlp_ratio)
            elif clustering is not None:
                raise ValueError(f"clustering must be 'conv', 'mlp' or None, "
                                 f'got {clustering!r}')

    def forward(
        self,
        x: torch.Tensor,
        hw: Tuple[int, int],
        assignment: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """x: (B, N, C) normalised tokens; assignment: (B, M, N) or None.

        Returns the attention output (B, N, C) and the assignment used (the
        fresh one if this layer owns a clustering network), for later blocks.
        """
        if self.num_clusters == 0:
            kv = x
        else:
            if self.clustering is not None:
                assignment = soft_assignment(self.clustering(x, hw))
            elif assignment is None:
                raise ValueError('this PaCa layer has no clustering network '
                                 'of its own and was given no assignment')
            kv = self.cluster_norm(torch.bmm(assignment, x))
        out = multi_head_attention(
            self.q(x), self.k(kv), self.v(kv), self.num_heads)
        return self.proj(out), assignment

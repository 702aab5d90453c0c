"""Multi-head attention from N query tokens to M key/value tokens.

Both ClusTR (keys/values = DPC-kNN cluster tokens) and PaCa-ViT (keys/values =
soft cluster tokens) reduce to this once the summary tokens exist, so the head
splitting and the ``scaled_dot_product_attention`` call live here once.
"""
import torch
import torch.nn.functional as F


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, N, C) -> (B, heads, N, C // heads)."""
    b, n, c = x.shape
    return x.reshape(b, n, num_heads, c // num_heads).transpose(1, 2)


def multi_head_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         num_heads: int) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v per head; (B, N, C), (B, M, C) x2 -> (B, N, C).

    Uses the fused ``scaled_dot_product_attention`` kernel, which never
    materialises the N x M attention matrix on backends with flash kernels.
    Under ``torch.jit.trace`` (the FLOP counters of mmdet, mmpretrain and
    mmpose, export) the same maths runs as two matmuls: jit-based counters
    know ``matmul`` but not the fused op, and would count attention as free.
    """
    b, n, c = q.shape
    q = split_heads(q, num_heads)
    k = split_heads(k, num_heads)
    v = split_heads(v, num_heads)
    if torch.jit.is_tracing():
        attn = torch.matmul(q, k.transpose(-2, -1)) * (c // num_heads)**-0.5
        out = torch.matmul(attn.softmax(-1), v)
    else:
        out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(b, n, c)

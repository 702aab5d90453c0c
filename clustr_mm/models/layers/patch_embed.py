"""Overlapping convolutional patch embedding (PVTv2 / ClusTR style)."""
from typing import Tuple

import torch
from torch import nn


class OverlapPatchEmbed(nn.Module):
    """Conv with ``padding = kernel_size // 2`` then LayerNorm over channels.

    Kernels larger than the stride let neighbouring patches overlap, which is
    the only positional signal besides the MLP's depthwise conv.

    Args:
        in_channels (int): Input channels.
        embed_dims (int): Output channels.
        kernel_size (int): Conv kernel (7 for stage 1, 3 later in ClusTR).
        stride (int): Conv stride (4 for stage 1, 2 later).
        norm_eps (float): LayerNorm epsilon. Default 1e-5.
    """
    flop_kind = 'embedding'  # what analysis.flops counts its work as

    def __init__(self, in_channels: int, embed_dims: int, kernel_size: int,
                 stride: int, norm_eps: float = 1e-5):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, embed_dims, kernel_size, stride,
                              padding=kernel_size // 2)
        self.norm = nn.LayerNorm(embed_dims, eps=norm_eps)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """(B, C_in, H_in, W_in) -> tokens (B, H * W, C) and (H, W)."""
        x = self.proj(x)
        hw = (x.shape[2], x.shape[3])
        return self.norm(x.flatten(2).transpose(1, 2)), hw


def tokens_to_map(x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, H, W) as a channels-last view (no copy).

    Permuting a (B, H, W, C) view keeps the batch stride H*W*C even for
    B = 1, which oneDNN needs to recognise channels-last (its depthwise and
    strided convs are several times faster on it, with channels-last output).
    Maps leaving a backbone must be made contiguous: necks and heads (e.g.
    mmcv's CPU RoIAlign) assume standard NCHW.
    """
    return x.reshape(x.shape[0], hw[0], hw[1], x.shape[2]).permute(0, 3, 1, 2)

"""TCFormer's multi-stage token aggregation (MTA) pose neck, on grids.

TCFormer (CVPR 2022), whose pose settings ClusTR's paper follows, fuses all
four backbone stages top-down and reads keypoints from the stride-4 result.
On a regular grid its token up-sampling is a nearest 2x up-sampling and its
token-to-map step a reshape, so the neck is an FPN-style top-down path (1x1
laterals, up-sample and add) with one PVTv2-style transformer block after
each merge except at the coarsest level.
"""
from typing import Sequence, Tuple

import torch
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import nn

from ...registry import register_model
from ..layers import ConvFFN, SummaryAttention, tokens_to_map


class PooledAttentionBlock(nn.Module):
    """Pre-LayerNorm block: attention to cell-averaged keys/values, then a
    convolutional MLP, each with a residual.

    Args:
        dim (int): Channels.
        num_heads (int): Attention heads; must divide ``dim``.
        pool_ratio (int): Side of the cells averaged into keys/values.
        mlp_ratio (int): Hidden channels of the MLP per channel.
    """

    def __init__(self, dim: int, num_heads: int, pool_ratio: int,
                 mlp_ratio: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SummaryAttention(
            dim, num_heads, dict(type='AvgGridPool', sr_ratio=pool_ratio))
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = ConvFFN(dim, dim * mlp_ratio)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """x: (B, H*W, C) tokens of the ``hw`` grid."""
        x = x + self.attn(self.norm1(x), hw)[0]
        return x + self.mlp(self.norm2(x), hw)


@register_model
class MultiStageAggregation(BaseModule):
    """Top-down fusion of a feature pyramid into one stride-4 map (TCFormer's
    MTA on regular grids), for mmpose's ``HeatmapHead``.

    1. Each level i: a 1x1 conv (bias, no norm, no activation) to
       ``out_channels``.
    2. From the coarsest level down: the fused coarser map, nearest-resized
       to level i's size, is added to level i's lateral, and one
       :class:`PooledAttentionBlock` (keys/values averaged over
       ``pool_ratios[i]`` cells) runs on the sum. The coarsest level has no
       block.
    3. Returns ``(fused finest map,)``: mmpose's heads read the last map of
       the tuple they are given, and a list of necks would be dropped by
       mmpose's config check, so this one module does the whole aggregation.

    With ClusTR-S (in_channels 64, 128, 256, 512) and the defaults: 2.65 M
    parameters (2.68 M with the 1x1 133-keypoint head), 2.90 GFLOPs at
    256x192 (3.01 G with the head; one multiply-add = one FLOP, the count
    of ``tools/analysis/get_flops.py``), 2.1 G of it in the stride-4 block.

    ``output_level`` = 0: its one map has the stride of its finest input
    (the pose config check reads it).

    Args:
        in_channels (Sequence[int]): Channels of the input maps, finest
            (stride 4) first; at least two levels, each map half the size of
            the one before.
        out_channels (int): Channels of every fused map. Default 256.
        num_heads (int): Attention heads of every block. Default 4.
        mlp_ratio (int): MLP hidden channels / ``out_channels``. Default 4.
        pool_ratios (Sequence[int]): Key/value cell side of the block of each
            level but the coarsest, finest first. Default (8, 4, 2): 8x6
            key/value tokens at every level for a 256x192 input.
        init_cfg (dict | list[dict], optional): MMEngine initialisation.
            Default: Xavier-uniform convolutions (as TCFormer's neck),
            truncated-normal (std 0.02) linear layers.
    """

    output_level = 0

    def __init__(self,
                 in_channels: Sequence[int],
                 out_channels: int = 256,
                 num_heads: int = 4,
                 mlp_ratio: int = 4,
                 pool_ratios: Sequence[int] = (8, 4, 2),
                 init_cfg=(dict(type='Xavier', layer='Conv2d',
                                distribution='uniform'),
                           dict(type='TruncNormal', layer='Linear', std=0.02,
                                bias=0.0))):
        super().__init__(init_cfg=[dict(c) for c in init_cfg]
                         if isinstance(init_cfg, tuple) else init_cfg)
        in_channels = list(in_channels) if isinstance(
            in_channels, (list, tuple)) else in_channels
        if not isinstance(in_channels, list) or len(in_channels) < 2 or any(
                isinstance(c, bool) or not isinstance(c, int) or c < 1
                for c in in_channels):
            raise ValueError(f'in_channels must list the positive channel '
                             f'counts of at least two levels, finest first; '
                             f'got {in_channels!r}')
        pool_ratios = list(pool_ratios)
        if len(pool_ratios) != len(in_channels) - 1:
            raise ValueError(
                f'pool_ratios needs one entry per level but the coarsest '
                f'({len(in_channels) - 1} for in_channels={in_channels}), '
                f'got {pool_ratios!r}')
        for name, value in (('out_channels', out_channels),
                            ('num_heads', num_heads), ('mlp_ratio', mlp_ratio)):
            if isinstance(value, bool) or not isinstance(value,
                                                         int) or value < 1:
                raise ValueError(f'{name} must be a positive int, got '
                                 f'{value!r}')
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.lateral_convs = nn.ModuleList(
            nn.Conv2d(c, out_channels, 1) for c in in_channels)
        # blocks[i] runs after the merge at level i (no block at the top)
        self.blocks = nn.ModuleList(
            PooledAttentionBlock(out_channels, num_heads, r, mlp_ratio)
            for r in pool_ratios)

    def forward(self, inputs: Sequence[torch.Tensor]
                ) -> Tuple[torch.Tensor]:
        """inputs: the backbone's maps, finest first (``out_indices`` of all
        levels); returns a one-map tuple (B, out_channels, H_0, W_0)."""
        if not isinstance(inputs, (list, tuple)) or len(inputs) != len(
                self.in_channels):
            got = (len(inputs) if isinstance(inputs, (list, tuple)) else
                   type(inputs).__name__)
            raise ValueError(
                f'MultiStageAggregation expects {len(self.in_channels)} '
                f'maps (in_channels={self.in_channels}), got {got}: give the '
                f'backbone out_indices of every level')
        channels = [x.shape[1] for x in inputs]
        if channels != self.in_channels:
            raise ValueError(f'input maps have {channels} channels but the '
                             f'neck was built with in_channels='
                             f'{self.in_channels}')
        fused = self.lateral_convs[-1](inputs[-1])
        for i in range(len(inputs) - 2, -1, -1):
            lateral = self.lateral_convs[i](inputs[i])
            h, w = lateral.shape[2:]
            x = lateral + F.interpolate(fused, size=(h, w), mode='nearest')
            tokens = self.blocks[i](x.flatten(2).transpose(1, 2), (h, w))
            fused = tokens_to_map(tokens, (h, w))
        return (fused.contiguous(), )

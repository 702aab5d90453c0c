"""Feed-forward network shared by ClusTR and PaCa-ViT blocks."""
import torch
from torch import nn

from .patch_embed import tokens_to_map


class ConvFFN(nn.Module):
    """``fc1 -> GELU(h + DWConv3x3(h)) -> fc2`` on a token sequence.

    Both papers add the depthwise conv's output to its input *before* the
    activation (a residual positional term), which is what this computes.

    Args:
        dim (int): Input/output channels.
        hidden_dim (int): Hidden channels (``mlp_ratio * dim``).
        drop (float): Dropout after the activation and after ``fc2``.
    """
    flop_kind = 'mlp'  # what analysis.flops counts its work as

    def __init__(self, dim: int, hidden_dim: int, drop: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.dwconv = nn.Conv2d(
            hidden_dim, hidden_dim, 3, padding=1, groups=hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor, hw: tuple) -> torch.Tensor:
        """x: (B, N, C) tokens of an ``hw = (H, W)`` grid, N = H * W."""
        h = self.fc1(x)
        # Channels-last view (see tokens_to_map): oneDNN's fast depthwise
        # path, and its output flattens back to tokens without a copy.
        grid = tokens_to_map(h, hw)
        # Accumulate into the conv output (autograd does not need it): one
        # large allocation fewer, which at high resolution costs page faults.
        h = self.dwconv(grid).flatten(2).transpose(1, 2).add_(h)
        if torch.is_grad_enabled() and h.requires_grad:
            h = self.act(h)  # autograd keeps the pre-activation
        else:
            # Inference: in place, one more large allocation saved.
            h = torch.ops.aten.gelu_(h, approximate=self.act.approximate)
        h = self.drop(h)
        return self.drop(self.fc2(h))

"""Feed-forward network shared by ClusTR and PaCa-ViT blocks."""
import torch
from torch import nn


class ConvFFN(nn.Module):
    """``fc1 -> GELU(h + DWConv3x3(h)) -> fc2`` on a token sequence.

    Both papers add the depthwise conv's output to its input *before* the
    activation (a residual positional term), which is what this computes.

    Args:
        dim (int): Input/output channels.
        hidden_dim (int): Hidden channels (``mlp_ratio * dim``).
        drop (float): Dropout after the activation and after ``fc2``.
    """

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
        b, n, c = h.shape
        # Channels-last view of the tokens, no copy. Built by permuting a
        # (B, H, W, C) view so the batch stride is H*W*C even for B = 1:
        # oneDNN only takes its fast channels-last depthwise path then (up to
        # 5x faster, and its output flattens back to tokens without a copy).
        grid = h.reshape(b, hw[0], hw[1], c).permute(0, 3, 1, 2)
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

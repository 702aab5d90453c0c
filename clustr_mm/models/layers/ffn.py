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
        grid = h.transpose(1, 2).reshape(b, c, hw[0], hw[1])
        h = h + self.dwconv(grid).flatten(2).transpose(1, 2)
        h = self.drop(self.act(h))
        return self.drop(self.fc2(h))

"""Input checks shared by the backbones: fail early with a message that names
the problem, rather than deep inside the clustering."""
import torch

from ..layers.graph_safety import assert_finite


def check_images(x: torch.Tensor, in_channels: int, owner: str) -> None:
    """(B, C, H, W) with C = ``in_channels`` and finite values.

    An empty batch (B = 0) and images smaller than the total stride are
    allowed: outputs are empty, or 1x1 at the coarse stages (the convolutions
    pad). Non-finite values are refused: they would make every distance, and
    so every cluster assignment, meaningless.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'{owner} expects a tensor, got {type(x).__name__}')
    if x.dim() != 4 or x.shape[1] != in_channels:
        raise ValueError(f'{owner} expects images of shape (B, {in_channels}, '
                         f'H, W), got {tuple(x.shape)}')
    if x.shape[2] == 0 or x.shape[3] == 0:
        raise ValueError(f'{owner} got images with an empty side: '
                         f'{tuple(x.shape)}')
    if x.is_floating_point():
        assert_finite(x, f'{owner} input contains NaN or Inf values')

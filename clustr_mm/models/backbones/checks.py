"""The checks every backbone makes on what it is given and what it makes.

Construction arguments are checked with a message naming the argument, the
value found and what is expected; images before the first stage; each
stage's output for NaN/Inf without a host sync (a NaN in one block reaches
every token through the cluster tokens, so one check per stage suffices).
"""
import numbers
from typing import Optional, Sequence

import torch
from torch import nn

from ..layers.arg_checks import (check_bool, check_hidden_width,  # noqa: F401
                                 check_int, check_number, warn_unused)
from ...graph_safety import assert_finite


def check_per_stage(name: str, values, num_stages: Optional[int],
                    minimum: float, integer: bool = True) -> tuple:
    """One number >= ``minimum`` per stage (ints when ``integer``)."""
    kind = 'int' if integer else 'number'
    expected = (f'a sequence of {num_stages if num_stages else "per-stage"} '
                f'{kind}s >= {minimum} (one per stage)')
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ValueError(f'{name} must be {expected}, got {values!r}')
    values = tuple(values)
    if num_stages is not None and len(values) != num_stages:
        raise ValueError(f'{name} has {len(values)} entries, needs '
                         f'{num_stages} (one per stage): {values}')
    number = numbers.Integral if integer else numbers.Real
    if any(isinstance(v, bool) or not isinstance(v, number) or v < minimum
           for v in values):
        raise ValueError(f'{name} must be {expected}, got {values!r}')
    return values


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


def check_stage_output(backbone: nn.Module, stage: int, out: torch.Tensor,
                       images: torch.Tensor) -> None:
    """Refuse NaN/Inf in a stage's output, saying what was found.

    No host sync on the normal path (a device-side assert). Where the check
    fails at once (the CPU), the failure is explained: non-finite weights are
    named, else the images' largest magnitude is given (activations overflow
    for images far from normalised ones), else the activations themselves
    overflowed (in training: a diverged run).
    """
    owner = type(backbone).__name__
    message = (f'{owner} stage {stage + 1} produced NaN/Inf values from '
               'finite images: its weights are not finite, the images are '
               'far larger than normalised ones, or (in training) the run '
               'diverged')
    try:
        assert_finite(out, message)
    except RuntimeError as error:
        if message not in str(error):
            raise
        raise RuntimeError(
            _explain_non_finite(backbone, stage, images)) from None


def _explain_non_finite(backbone: nn.Module, stage: int,
                        images: torch.Tensor) -> str:
    owner = type(backbone).__name__
    head = (f'{owner} stage {stage + 1} produced NaN/Inf values from finite '
            'images')
    bad = [name for name, p in backbone.named_parameters()
           if not torch.isfinite(p).all()]
    if bad:
        return (f'{head}: {len(bad)} weight tensor(s) hold NaN/Inf, first '
                f'{bad[:3]} (a corrupt checkpoint or a diverged run)')
    largest = float(images.detach().abs().amax())
    if largest > 1e4:
        return (f'{head}: the images reach |x| = {largest:.3g}, which '
                f'overflows {images.dtype} inside the stage; normalise them '
                '(mean/std, as the data preprocessor does)')
    return (f'{head}, although the weights are finite and the images reach '
            f'only |x| = {largest:.3g}: activations overflowed; in training '
            'this means the run diverged (lower the learning rate, clip '
            'gradients)')

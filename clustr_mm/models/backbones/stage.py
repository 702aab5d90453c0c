"""One stage of a pyramid backbone, shared by ClusTR and PaCa-ViT.

A stage is what both papers' architecture tables list per row: a patch
embedding (``downsample``), ``depth`` pre-norm blocks and a LayerNorm; it
takes a (B, C_in, H_in, W_in) map and returns its (B, C, H, W) map.
"""
from typing import List, NamedTuple, Optional, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import assignment_map, tokens_to_map


def map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, H * W, C); a view when ``x`` is channels-last."""
    return x.flatten(2).transpose(1, 2)


def drop_path_rates(rate: float, depths: Sequence[int]) -> List[List[float]]:
    """Stochastic depth per block: 0 to ``rate`` linearly over all blocks
    (the official codes' ``torch.linspace`` values), split per stage.
    Computed on the CPU also when a model is built under
    ``torch.device('meta')`` (shapes only: tests/test_release_layouts.py)."""
    rates = torch.linspace(0, rate, sum(depths), device='cpu').tolist()
    starts = [sum(depths[:i]) for i in range(len(depths))]
    return [rates[s:s + d] for s, d in zip(starts, depths)]


class BlockOutput(NamedTuple):
    """What a block returns: its ``tokens`` (B, N, C); ``shared``, the
    assignment the next block of the stage receives (PaCa-ViT's stage-wise
    clustering; other blocks pass on the one they got); ``used``, per scale
    the assignment behind its attention's keys and values (none for full
    attention), which the stage records."""
    tokens: torch.Tensor
    shared: Optional[torch.Tensor]
    used: List[torch.Tensor]


class PyramidStage(nn.Module):
    """Patch embedding, blocks, LayerNorm; map in, map out.

    Every block is called as ``block(tokens, hw, assignment)`` and returns a
    :class:`BlockOutput`; nothing else of a block is read.

    Args:
        downsample (nn.Module, optional): Map -> (tokens, (H, W)); None when
            the input is already this stage's embedded map (PaCa's stem).
        blocks (Sequence[nn.Module]): The stage's blocks.
        dim (int): Channels of the stage.
        norm_eps (float): Epsilon of the output LayerNorm. Default 1e-6.

    Attributes:
        with_cp (bool): Checkpoint each block (non-reentrant
            ``torch.utils.checkpoint``) while gradients are on: its
            activations are recomputed in the backward pass instead of kept.
            The recomputation runs the same code on the same input under the
            same RNG state, so the clustering's no-grad part gives the same
            assignment again. Default False.
        keep_assignments (bool): Set by the backbone's ``keep_assignments``.
        assignments (list): With ``keep_assignments``, after each forward
            one entry per block: the maps (see
            :func:`~..layers.assignment_map`) of the per-scale assignments
            it returned, empty for full attention.
    """

    def __init__(self, downsample: Optional[nn.Module],
                 blocks: Sequence[nn.Module], dim: int,
                 norm_eps: float = 1e-6):
        super().__init__()
        self.downsample = downsample
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self.with_cp = False
        self.keep_assignments = False
        self.assignments: List[List[torch.Tensor]] = []

    def forward(self, x: torch.Tensor,
                assignment: Optional[torch.Tensor] = None,
                skip: Optional[torch.Tensor] = None) -> torch.Tensor:
        """x: (B, C_in, H_in, W_in) -> (B, C, H, W), a channels-last view.

        Args:
            assignment: (B, M, N) assignment handed to the first block (PaCa's
                teacher network), or None.
            skip: (B, C, H, W) map added to the tokens before the norm
                (the teacher's stage features), or None.
        """
        if self.downsample is not None:
            tokens, hw = self.downsample(x)
        else:
            tokens, hw = map_to_tokens(x), (x.shape[2], x.shape[3])
        cp = self.with_cp and torch.is_grad_enabled()
        kept = []
        for block in self.blocks:
            if cp:
                tokens, assignment, used = checkpoint(
                    block, tokens, hw, assignment, use_reentrant=False)
            else:
                tokens, assignment, used = block(tokens, hw, assignment)
            if self.keep_assignments:
                kept.append([assignment_map(a, hw) for a in used])
        if skip is not None:
            tokens = tokens + map_to_tokens(skip)
        tokens = self.norm(tokens)
        if self.keep_assignments:
            self.assignments = kept
        return tokens_to_map(tokens, hw)

"""``frozen_stages`` / ``norm_eval`` handling shared by the backbones."""
from typing import Iterable, Tuple, Type

from torch import nn


def apply_freezing(backbone: nn.Module, frozen: Iterable[nn.Module],
                   norm_eval: bool,
                   norm_types: Tuple[Type[nn.Module], ...]) -> None:
    """Called after ``nn.Module.train(mode)``, which undoes both each time.

    Frozen modules go to eval mode without gradients; with ``norm_eval`` in
    training mode every ``norm_types`` layer of the backbone is put in eval
    mode too (frozen running statistics, as mmdet/mmseg backbones do).
    """
    for module in frozen:
        module.eval()
        for param in module.parameters():
            param.requires_grad = False
    if backbone.training and norm_eval:
        for m in backbone.modules():
            if isinstance(m, norm_types):
                m.eval()

"""The learning-rate curve the official ClusTR and PaCa-ViT ImageNet runs
train with: timm's cosine scheduler with a linear warm-up (DeiT's, PVTv2's),
stepped once per epoch.

MMEngine's ``LinearLR`` + ``CosineAnnealingLR`` pair cannot give it: its
cosine starts at the end of the warm-up (a curve over epochs 5-300), while
timm's spans every epoch from 0, the warm-up only replacing its first
values. :class:`WarmupCosineLR` is that curve in closed form.
"""
import math

from mmengine.optim.scheduler.lr_scheduler import LRSchedulerMixin
from mmengine.optim.scheduler.param_scheduler import INF, _ParamScheduler
from mmengine.registry import PARAM_SCHEDULERS


@PARAM_SCHEDULERS.register_module(force=True)
class WarmupCosineLR(LRSchedulerMixin, _ParamScheduler):
    """Epoch t of ``[0, end)`` trains with, for each base learning rate b
    (timm's ``CosineLRScheduler(t_initial=end, warmup_t=warmup_epochs,
    warmup_lr_init=warmup_factor * b, lr_min=eta_min)``, stepped per
    epoch)::

        t <  warmup_epochs: b * (f + (1 - f) * t / warmup_epochs)
        t >= warmup_epochs: eta_min + (b - eta_min) * (1 + cos(pi t / end)) / 2

    Args:
        optimizer: The wrapped optimizer.
        warmup_epochs (int): Epochs of linear warm-up (>= 0).
        warmup_factor (float): f, the first epoch's fraction of b, in (0, 1].
        eta_min (float): The learning rate the cosine ends at (>= 0).
        end (int): The epochs the cosine spans, the whole run's; the runner
            sets it to ``train_cfg.max_epochs`` when the config does not.
    """

    def __init__(self, optimizer, warmup_epochs: int = 5,
                 warmup_factor: float = 1e-3, eta_min: float = 1e-5,
                 begin: int = 0, end: int = INF, last_step: int = -1,
                 by_epoch: bool = True, verbose: bool = False):
        if not by_epoch or begin != 0:
            raise ValueError(
                f'WarmupCosineLR steps per epoch over the whole run: '
                f'by_epoch must be True and begin 0, got by_epoch={by_epoch}, '
                f'begin={begin}')
        if not (isinstance(end, int) and 0 < end < INF):
            raise ValueError(f'WarmupCosineLR: end must be the run\'s '
                             f'epochs (a positive int), got {end!r}')
        if not (isinstance(warmup_epochs, int) and 0 <= warmup_epochs < end):
            raise ValueError(f'WarmupCosineLR: warmup_epochs must be an int '
                             f'in [0, end={end}), got {warmup_epochs!r}')
        if not 0 < warmup_factor <= 1:
            raise ValueError(f'WarmupCosineLR: warmup_factor must be in '
                             f'(0, 1], got {warmup_factor!r}')
        if not eta_min >= 0:
            raise ValueError(f'WarmupCosineLR: eta_min must be >= 0, got '
                             f'{eta_min!r}')
        self.warmup_epochs = warmup_epochs
        self.warmup_factor = warmup_factor
        self.eta_min = eta_min
        super().__init__(optimizer, begin=begin, end=end,
                         last_step=last_step, by_epoch=by_epoch,
                         verbose=verbose)

    def _get_value(self):
        t = self.last_step
        if t < self.warmup_epochs:
            f = self.warmup_factor + (1 - self.warmup_factor) * (
                t / self.warmup_epochs)
            return [base * f for base in self.base_values]
        cosine = (1 + math.cos(math.pi * t / self.end)) / 2
        return [self.eta_min + (base - self.eta_min) * cosine
                for base in self.base_values]

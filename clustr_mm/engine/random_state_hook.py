"""Resume that continues the random streams, not just the weights."""
import random

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module(force=True)
class RandomStateHook(Hook):
    """Store the torch / numpy / python RNG states in every checkpoint and
    restore them on resume.

    MMEngine saves weights, optimizer and schedulers but not the random
    generators, so a resumed run draws different augmentations and dropout
    masks than the uninterrupted one would have. With this hook (in every
    shipped config; ``tools/train.py`` adds it to others) and the seed that
    ``tools/train.py --resume`` restores before the samplers are built
    (``resume.py``), a CPU run killed after a checkpoint and resumed
    reproduces the uninterrupted run's losses and weights exactly.
    """

    priority = 'VERY_LOW'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        state = dict(torch=torch.get_rng_state(), numpy=np.random.get_state(),
                     python=random.getstate())
        if torch.cuda.is_available():
            state['cuda'] = torch.cuda.get_rng_state_all()
        checkpoint['rng_state'] = state

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not getattr(runner, '_resume', False):
            # load_from / tools/test.py: weights only, nothing continues
            return
        state = checkpoint.get('rng_state')
        if state is None:
            runner.logger.warning(
                'checkpoint has no rng_state: the resumed run draws '
                'different random numbers than an uninterrupted one')
            return
        torch.set_rng_state(state['torch'])
        np.random.set_state(state['numpy'])
        random.setstate(state['python'])
        if 'cuda' in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state['cuda'])

"""Say which optimizer and scheduler settings a resumed checkpoint overrides.

On resume MMEngine loads the optimizer's and the schedulers' state dicts, and
with them their settings: a learning rate, weight decay or schedule length
changed on the command line is silently replaced by the checkpoint's, while
the dumped config shows the new value. This hook compares, just before those
states are loaded, what the current config built with what the checkpoint
holds, and logs every difference (the checkpoint's value is the one used).
"""
from typing import Iterable, List, Mapping

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

# scheduler state that is progress, not a setting
_PROGRESS = {'last_step', 'base_values', 'optimizer', 'verbose'}


def _differs(a, b) -> bool:
    try:
        return bool(a != b)
    except Exception:  # tensors, arrays: compare their values
        return repr(a) != repr(b)


def optimizer_overrides(current: List[Mapping], saved: List[Mapping],
                        prefix: str = 'optimizer') -> List[str]:
    """``name: config -> checkpoint`` per hyperparameter that differs in some
    param group (the base ``initial_lr`` where schedulers set it, as ``lr``
    itself is the scheduled value at the time of saving)."""
    lines = []
    if len(current) != len(saved):
        return [f'{prefix}: {len(current)} param groups in the config, '
                f'{len(saved)} in the checkpoint']
    keys = sorted({k for g in current for k in g} - {'params'})
    for key in keys:
        if key == 'lr' and all('initial_lr' in g for g in current + saved):
            continue
        changed = [(i, g.get(key), s.get(key))
                   for i, (g, s) in enumerate(zip(current, saved))
                   if key in s and _differs(g.get(key), s.get(key))]
        if changed:
            i, ours, theirs = changed[0]
            name = 'lr' if key == 'initial_lr' else key
            where = ('' if len(current) == 1 else
                     f' (all {len(current)} param groups)'
                     if len(changed) == len(current) else
                     f' (param group {i}; {len(changed)} of {len(current)} '
                     'groups differ)')
            lines.append(f'{prefix} {name}: {ours!r} in the config -> '
                         f'{theirs!r} from the checkpoint{where}')
    return lines


def scheduler_overrides(current: Iterable, saved: List[Mapping],
                        prefix: str = 'param_scheduler') -> List[str]:
    """``name: config -> checkpoint`` per scheduler setting that differs."""
    current = list(current)
    if len(current) != len(saved):
        return [f'{prefix}: {len(current)} schedulers in the config, '
                f'{len(saved)} in the checkpoint (the checkpoint\'s states '
                'are loaded in order)']
    lines = []
    for i, (scheduler, state) in enumerate(zip(current, saved)):
        ours = scheduler.state_dict()
        for key in sorted(set(ours) & set(state)):
            if key in _PROGRESS or key.startswith('_'):
                continue
            if _differs(ours[key], state[key]):
                lines.append(
                    f'{prefix}[{i}] ({type(scheduler).__name__}) {key}: '
                    f'{ours[key]!r} in the config -> {state[key]!r} from the '
                    'checkpoint')
    return lines


def resume_overrides(runner, checkpoint: Mapping) -> List[str]:
    """Every optimizer / scheduler setting the checkpoint replaces."""
    lines = []
    wrapper = runner.optim_wrapper
    saved = checkpoint.get('optimizer')
    if saved and hasattr(wrapper, 'optimizer'):
        lines += optimizer_overrides(wrapper.optimizer.param_groups,
                                     saved.get('param_groups', []))
    schedulers = runner.param_schedulers
    saved = checkpoint.get('param_schedulers')
    if saved and isinstance(schedulers, list) and isinstance(saved, list):
        lines += scheduler_overrides(schedulers, saved)
    elif saved and isinstance(schedulers, dict) and isinstance(saved, dict):
        for name, group in schedulers.items():
            if name in saved:
                lines += scheduler_overrides(group, saved[name],
                                             f'param_scheduler.{name}')
    return lines


@HOOKS.register_module(force=True)
class ResumeSettingsHook(Hook):
    """Log every optimizer / scheduler setting of the config that a resumed
    checkpoint replaces (added by ``tools/train.py --resume``)."""

    priority = 'VERY_HIGH'

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        if not getattr(runner, '_resume', False):
            return
        lines = resume_overrides(runner, checkpoint)
        if lines:
            runner.logger.warning(
                'resuming: the checkpoint\'s optimizer and scheduler states '
                'replace these settings of the config (the run continues '
                'with the checkpoint\'s values; to use the new ones, start '
                'from its weights with load_from=PATH instead of '
                '--resume):\n  ' + '\n  '.join(lines))

"""Registration in MMEngine's root registry, safe against double import."""
from mmengine.registry import MODELS


def register_model(cls):
    """Register ``cls`` in the root ``MODELS`` registry under its class name.

    Every OpenMMLab library's registry is a child of the root one and falls
    back to it, so one registration serves mmpretrain, mmdet, mmseg and mmpose.
    Re-importing the defining module (e.g. ``importlib.reload``) re-registers
    the fresh class; a *different* class with the same name is an error.
    """
    existing = MODELS.module_dict.get(cls.__name__)
    if existing is not None and (existing.__module__, existing.__qualname__) != (
            cls.__module__, cls.__qualname__):
        raise KeyError(
            f'{cls.__name__} is already registered in MMEngine MODELS by '
            f'{existing.__module__}; refusing to shadow it with {cls.__module__}')
    MODELS.register_module(name=cls.__name__, module=cls, force=True)
    return cls


# The changes ``import clustr_mm`` makes to MMEngine and torch beyond adding
# its own registry entries (README: "What importing clustr_mm changes").
PROCESS_WIDE_CHANGES = ('checkpoint_loaders', 'atomic_writes', 'scope_check',
                        'lazy_heads', 'eager_optimizer_step')
SKIP_VARIABLE = 'CLUSTR_MM_SKIP'


def change_wanted(name: str) -> bool:
    """Whether the process-wide change ``name`` is to be made.

    ``CLUSTR_MM_SKIP`` (read when the package is imported) lists the changes
    to leave out, comma-separated, or ``all``: e.g. a project that only wants
    the backbones sets ``CLUSTR_MM_SKIP=all``.
    """
    import os
    if name not in PROCESS_WIDE_CHANGES:
        raise ValueError(f'unknown change {name!r}; the changes are '
                         f'{PROCESS_WIDE_CHANGES}')
    raw = os.environ.get(SKIP_VARIABLE, '')
    skipped = {part.strip() for part in raw.split(',') if part.strip()}
    unknown = skipped - set(PROCESS_WIDE_CHANGES) - {'all'}
    if unknown:
        raise ValueError(
            f'{SKIP_VARIABLE}={raw!r} names {sorted(unknown)}; expected a '
            f'comma-separated list of {PROCESS_WIDE_CHANGES} or "all"')
    return 'all' not in skipped and name not in skipped


# what leaving each change out takes away, for the errors it causes
SKIP_EFFECTS = dict(
    checkpoint_loaders='clustr_mm\'s checkpoint loader, which converts '
    'official PaCa-ViT files on load (convert the file with '
    'tools/model_converters/paca_official_to_mm.py, or unset it)',
    lazy_heads='the registration of clustr_mm\'s heads (PaCaSegHead) in '
    'their library\'s scope (import clustr_mm.models.heads.paca_seg_head '
    'in the config\'s custom_imports, or unset it)',
    atomic_writes='atomic checkpoint writes', scope_check='the check of '
    'mmcv\'s compiled ops for mmdet/mmseg/mmpose configs',
    eager_optimizer_step='the eager optimizer step of runs with MMEngine\'s '
    '`compile` option (clustr_mm/engine/compile.py)')


ON_VALUES = ('1', 'on', 'true', 'yes')
OFF_VALUES = ('0', 'off', 'false', 'no')


def switch(variable: str, default: bool) -> bool:
    """An on/off ``CLUSTR_MM_*`` environment switch: unset or empty is
    ``default``; :data:`ON_VALUES` / :data:`OFF_VALUES` (any case) turn it
    on / off; anything else is a ValueError naming the variable and the
    values it takes (a misspelt value must not leave it as it was)."""
    import os
    raw = os.environ.get(variable, '')
    value = raw.strip().lower()
    if not value:
        return default
    if value in ON_VALUES:
        return True
    if value in OFF_VALUES:
        return False
    raise ValueError(f'{variable}={raw!r} is not a switch value: use one of '
                     f'{ON_VALUES} to turn it on or {OFF_VALUES} to turn it '
                     f'off (unset: {"on" if default else "off"})')


def switch_value(name: str, value, default: bool = False) -> bool:
    """A config's on/off option (``allow_partial_load``, ``resume``) read as
    strictly as :func:`switch` reads the environment: None is ``default``;
    True/False, 1/0 and the words of :data:`ON_VALUES` / :data:`OFF_VALUES`
    (any case; ``--cfg-options`` leaves ``no`` a string, which Python reads
    as true) are what they say; anything else is a ValueError naming
    ``name``."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ON_VALUES:
        return True
    if isinstance(value, str) and value.strip().lower() in OFF_VALUES:
        return False
    raise ValueError(f'{name}={value!r} is not an on/off value: use True or '
                     f'False (or one of {ON_VALUES} / {OFF_VALUES})')


def skip_note(name: str) -> str:
    """A sentence for an error that leaving out change ``name`` may have
    caused: empty unless ``CLUSTR_MM_SKIP`` leaves it out."""
    import os
    if change_wanted(name):
        return ''
    return (f' Note: {SKIP_VARIABLE}={os.environ.get(SKIP_VARIABLE)!r} is '
            f'set, which leaves out {SKIP_EFFECTS[name]}.')

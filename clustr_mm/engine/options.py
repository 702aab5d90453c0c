"""Paths and switches that mean what they say.

What a tool's ``--work-dir`` / ``--cfg-options`` give the config is checked
here, before any model is built or data is read: an empty work dir (MMEngine
writes the checkpoints, the config and the logs into the current directory),
a ``--cfg-options`` key that runs into a list (MMEngine's ``list indices must
be integers``), and the runner's on/off options given as words
(``resume=no`` is a non-empty string, which MMEngine reads as yes).
"""
import os.path as osp
from typing import Optional

from ..registry import switch_value


def check_work_dir(value, source: str) -> None:
    """Refuse a work dir that is empty or names a file; ``source`` says
    where it came from (``--work-dir``, ``work_dir in CONFIG``)."""
    if value is None:
        return
    if not isinstance(value, str):
        raise ValueError(f'{source}={value!r}: a work dir is a folder path '
                         '(a string)')
    if not value.strip():
        raise ValueError(
            f'{source}={value!r} is empty: MMEngine would write the '
            'checkpoints, the dumped config and the logs into the current '
            'directory. Name a folder (leave it out for '
            'work_dirs/<config name>)')
    if osp.exists(value) and not osp.isdir(value):
        raise ValueError(f'{source}={value!r} is a file, not a folder: the '
                         'checkpoints and logs need a folder')


def _describe(items) -> str:
    """``[TruncNormal(layer=Linear), Constant(layer=LayerNorm)]``."""
    parts = []
    for item in items:
        if isinstance(item, dict) and 'type' in item:
            rest = ', '.join(f'{k}={v}' for k, v in item.items()
                             if k != 'type' and k in ('layer', 'checkpoint',
                                                      'prefix'))
            parts.append(f'{item["type"]}({rest})')
        else:
            parts.append(repr(item))
    return '[' + ', '.join(parts) + ']'


def _list_in_the_way(cfg, key: str) -> Optional[tuple]:
    """(the dotted path of the list, the list, the key part after it) when
    ``key`` names a field of a list by a name instead of an index."""
    parts = key.split('.')
    node = getattr(cfg, '_cfg_dict', cfg)  # a Config is not a dict
    for i, part in enumerate(parts):
        if isinstance(node, (list, tuple)):
            if not part.isdigit():
                return '.'.join(parts[:i]), node, '.'.join(parts[i:])
            if int(part) >= len(node):
                return None  # MMEngine's own IndexError names it
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return None
    return None


def check_cfg_options(cfg, options: dict, config: str) -> None:
    """Refuse a ``--cfg-options`` key that addresses a list by a field name
    (``model.init_cfg.type=Pretrained`` where ``model.init_cfg`` is a list
    of initialisers), saying what the list holds and how to set it."""
    for key, value in (options or {}).items():
        found = _list_in_the_way(cfg, key)
        if found is None:
            continue
        where, items, rest = found
        head = (f'--cfg-options {key}={value!r}: {where} is a list in '
                f'{config} ({_describe(items)}), so it has no field '
                f'{rest.split(".")[0]!r}.')
        if where.split('.')[-1] == 'init_cfg':
            owner = where[:-len('.init_cfg')] or 'model'
            raise ValueError(
                f'{head} To start from a whole trained model use '
                '--cfg-options load_from=PATH; to load pretrained backbone '
                'weights, model.backbone.init_cfg.type=Pretrained '
                'model.backbone.init_cfg.checkpoint=PATH; to drop these '
                f'initialisers, {where}=None; to change one of them, name '
                f'it by its index ({where}.0.{rest}=..., which keeps that '
                f"entry's other keys). ({owner}'s init_cfg is a list here "
                'because it holds one initialiser per layer type.)')
        raise ValueError(
            f'{head} Name an entry by its index ({where}.0.{rest}=..., which '
            f"keeps that entry's other keys), or replace the whole list "
            f'({where}=[...])')


def merge_cfg_options(cfg, options: dict, config: str) -> None:
    """``cfg.merge_from_dict(options)`` after :func:`check_cfg_options`."""
    check_cfg_options(cfg, options, config)
    cfg.merge_from_dict(options or {})


#: The runner's on/off options (dotted paths in the config). MMEngine and
#: torch read them with ``if value:``, so the word ``no`` means yes;
#: ``compile`` may also be a dict of ``torch.compile`` options.
CONFIG_SWITCHES = ('resume', 'allow_partial_load', 'compile',
                   'find_unused_parameters', 'env_cfg.cudnn_benchmark',
                   'randomness.deterministic', 'randomness.diff_rank_seed')


def check_config_switches(cfg, config: str) -> None:
    """The :data:`CONFIG_SWITCHES` parsed strictly
    (:func:`~clustr_mm.registry.switch_value`) and stored as bools: the
    words of ``--cfg-options resume=no`` / ``allow_partial_load=no`` become
    False; any other value is refused naming the option."""
    for key in CONFIG_SWITCHES:
        *parents, name = key.split('.')
        node = getattr(cfg, '_cfg_dict', cfg)
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or node.get(name) is None:
            continue
        value = node[name]
        if key == 'compile' and isinstance(value, dict):
            continue
        try:
            node[name] = switch_value(key, value)
        except ValueError as err:
            hint = (' To resume from a file pass --resume PATH to '
                    'tools/train.py (or load_from=PATH resume=True)'
                    if key == 'resume' else
                    ' (or a dict of torch.compile options)'
                    if key == 'compile' else '')
            raise ValueError(f'{config}: {err}.{hint}') from None

"""The checkpoint layouts clustr_mm converts, behind one protocol, and the
one path every weight file takes through them.

A :class:`Converter` of a backbone says whether a state dict has one of the
layouts it knows (``detect``: the layout's name, or None), renames its keys
into a clustr_mm model's (``convert``: the backbone under ``backbone.``, an
ImageNet head as ``head.fc.*``; and the source keys it did not map, among
them a whole model's necks and heads, which keep their names) and infers the
backbone's constructor arguments from the converted keys (``infer_config``).
:data:`CONVERTERS` holds them all: the official ClusTR and PaCa-ViT code's
files (``clustr_official``, ``paca_official``, beside their arch tables,
like mmdet's ``pvt_convert``) and ClusTR's earlier clustr_mm key layout.
:func:`convert_checkpoint` applies whichever fits to a whole file: the
loader calls it on every file it reads (``load_from``, ``init_cfg``,
``tools/test.py``, the Inferencers), and the command-line converters read
through the loader.
"""
from collections import OrderedDict
from typing import Callable, List, Mapping, NamedTuple, Optional, Tuple

from mmengine.logging import print_log

from .clustr_official import (clustr_legacy_layout, clustr_official_layout,
                              convert_clustr_legacy, convert_clustr_official,
                              infer_clustr_config)
from .keys import StateDict, state_dict_key, strip_module_prefix, \
    unwrap_state_dict
from .paca_official import (convert_paca_official, infer_paca_config,
                            paca_official_layout)


class Converter(NamedTuple):
    """One backbone's checkpoint layouts (see the module docstring)."""
    backbone: str
    name: str  # whose files, in messages: 'official PaCa-ViT'
    detect: Callable[[Mapping], Optional[str]]
    convert: Callable[[Mapping], Tuple[StateDict, List[str]]]
    infer_config: Callable[[Mapping], dict]
    # what ``convert`` leaves out on purpose (not weights), in the log line
    dropped: str = 'tensors'


CONVERTERS = (
    Converter('ClusTR', 'official ClusTR', clustr_official_layout,
              convert_clustr_official, infer_clustr_config),
    Converter('PaCaViT', 'official PaCa-ViT', paca_official_layout,
              convert_paca_official, infer_paca_config,
              dropped='fixed blur kernels'),
    Converter('ClusTR', 'earlier clustr_mm ClusTR', clustr_legacy_layout,
              convert_clustr_legacy, infer_clustr_config),
)


def find_converter(state: Mapping) -> Optional[Tuple[Converter, str]]:
    """The converter that knows the layout of ``state`` (a state dict), and
    the layout's name; None when none does (e.g. today's clustr_mm keys)."""
    for converter in CONVERTERS:
        layout = converter.detect(state)
        if layout is not None:
            return converter, layout
    return None


def convert_checkpoint(checkpoint: Mapping, source: str) -> Optional[dict]:
    """A file's contents in clustr_mm's model layout, through the converter
    that knows its layout; None when none does (the file is used as it is).

    Returns ``{'state_dict': ..., 'meta': ...}``: the converted keys, a
    whole model's other keys (necks, heads) as named; the file's ``meta``
    kept with ``converted_from`` added, training-script entries (optimizer,
    epoch, args) left out. Logs one line saying what was converted.

    Raises:
        ValueError: a file of a known layout with keys its table does not
            map.
    """
    state = strip_module_prefix(unwrap_state_dict(checkpoint))
    found = find_converter(state)
    if found is None:
        return None
    converter, layout = found
    converted, unmatched = converter.convert(state)
    whole = any(k.startswith('backbone.') for k in state)
    kept = OrderedDict((k, state[k]) for k in unmatched
                       if whole and not k.startswith('backbone.'))
    unknown = [k for k in unmatched if k not in kept]
    if unknown:
        raise ValueError(
            f'{source}: an {converter.name} {layout} file, but no rule of '
            f'the conversion table maps its keys {unknown[:10]}'
            f'{" ..." if len(unknown) > 10 else ""}; expected only the '
            f'official {converter.backbone} backbone keys and, for a '
            'classifier, head.weight / head.bias')
    out = OrderedDict(converted)
    out.update(kept)
    wrapped = state_dict_key(checkpoint)
    meta = checkpoint.get('meta') if wrapped else None
    meta = dict(meta) if isinstance(meta, Mapping) else {}
    meta['converted_from'] = dict(layout=f'{converter.name} {layout}',
                                  source=source)
    print_log(f'clustr_mm: converted {converter.name} weights ({layout}) '
              f'from {source}: ' + _summary(checkpoint, state, converted,
                                            unmatched, kept, converter),
              logger='current')
    return dict(state_dict=out, meta=meta)


def _summary(checkpoint, state, converted, unmatched, kept, converter) -> str:
    renamed_head = 'head.weight' in state and 'head.fc.weight' in converted
    backbone = sum(k.startswith('backbone.') for k in converted)
    others = len(kept) + sum(
        not k.startswith('backbone.') and not (
            renamed_head and k.startswith('head.fc.')) for k in converted)
    dropped = len(state) - len(converted) - len(unmatched)
    wrapped = state_dict_key(checkpoint)
    ignored = sorted(str(k) for k in checkpoint
                     if wrapped and k not in (wrapped, 'meta'))
    parts = [f'{backbone} backbone tensors mapped to backbone.*']
    if renamed_head:
        parts.append('head.weight/bias -> head.fc.weight/bias')
    if others:
        parts.append(f'{others} neck/head tensors kept as named')
    if dropped:
        parts.append(f'{dropped} {converter.dropped} dropped')
    if ignored:
        parts.append(f'entries not loaded: {", ".join(ignored)}')
    return '; '.join(parts)

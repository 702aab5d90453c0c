"""The checkpoint layouts clustr_mm converts, behind one protocol.

A :class:`Converter` of a backbone says whether a state dict has one of the
layouts it knows (``detect``: the layout's name, or None), renames its keys
into a clustr_mm model's (``convert``: the backbone under ``backbone.``, an
ImageNet head as ``head.fc.*``, the keys of a whole model's other parts as
they are; and the source keys it could not map) and infers the backbone's
constructor arguments from the converted keys (``infer_config``).
:data:`CONVERTERS` holds them all: the official ClusTR and PaCa-ViT code's
files (``clustr_official``, ``paca_official``, beside their arch tables,
like mmdet's ``pvt_convert``) and ClusTR's earlier clustr_mm key layout.
"""
from typing import Callable, List, Mapping, NamedTuple, Optional, Tuple

from .clustr_official import (clustr_legacy_layout, clustr_official_layout,
                              convert_clustr_legacy, convert_clustr_official,
                              infer_clustr_config)
from .keys import StateDict
from .paca_official import (convert_paca_official, infer_paca_config,
                            paca_official_layout)


class Converter(NamedTuple):
    """One backbone's checkpoint layouts (see the module docstring)."""
    backbone: str
    detect: Callable[[Mapping], Optional[str]]
    convert: Callable[[Mapping], Tuple[StateDict, List[str]]]
    infer_config: Callable[[Mapping], dict]


CONVERTERS = (
    Converter('ClusTR', clustr_official_layout, convert_clustr_official,
              infer_clustr_config),
    Converter('PaCaViT', paca_official_layout, convert_paca_official,
              infer_paca_config),
    Converter('ClusTR', clustr_legacy_layout, convert_clustr_legacy,
              infer_clustr_config),
)


def find_converter(state: Mapping) -> Optional[Tuple[Converter, str]]:
    """The converter that knows the layout of ``state`` (a state dict), and
    the layout's name; None when none does (e.g. today's clustr_mm keys)."""
    for converter in CONVERTERS:
        layout = converter.detect(state)
        if layout is not None:
            return converter, layout
    return None

"""Key mapping from the official ClusTR code's checkpoints to clustr_mm.

The official model names its parts ``patch_embed{i}``, ``block{i}.{j}``,
``norm{i}`` (stages counted from 1) and ``head``; clustr_mm uses
``stages.{i}.downsample``, ``stages.{i}.blocks.{j}``, ``stages.{i}.norm``
(from 0) under the
classifier's ``backbone.`` prefix, and mmpretrain's ``head.fc``. Inside a block
only the MLP's depthwise conv differs (``mlp.dwconv.dwconv`` ->
``mlp.dwconv``); attention names (q, kv, kv1, kv2, weight_layer, proj) are
the same.
"""
import re
from collections import OrderedDict
from typing import List, Mapping, Optional, Tuple

import torch

from ..models.backbones.clustr import ClusTR
from .keys import strip_module_prefix

OFFICIAL = 'ImageNet classifier'
LEGACY = 'backbone or whole model'
# keys only the official code's files have
SIGNATURE = ('patch_embed1.proj.weight', 'block1.0.attn.q.weight')

_RULES = [
    (re.compile(r'^patch_embed(\d+)\.(.+)$'),
     lambda m: f'backbone.stages.{int(m[1]) - 1}.downsample.{m[2]}'),
    (re.compile(r'^block(\d+)\.(\d+)\.mlp\.dwconv\.dwconv\.(.+)$'),
     lambda m: f'backbone.stages.{int(m[1]) - 1}.blocks.{m[2]}.mlp.dwconv.'
     f'{m[3]}'),
    (re.compile(r'^block(\d+)\.(\d+)\.(.+)$'),
     lambda m: f'backbone.stages.{int(m[1]) - 1}.blocks.{m[2]}.{m[3]}'),
    (re.compile(r'^norm(\d+)\.(.+)$'),
     lambda m: f'backbone.stages.{int(m[1]) - 1}.norm.{m[2]}'),
    (re.compile(r'^head\.(weight|bias)$'), lambda m: f'head.fc.{m[1]}'),
]


def convert_clustr_official(
        official: Mapping[str, torch.Tensor]
) -> Tuple['OrderedDict[str, torch.Tensor]', List[str]]:
    """Rename official keys to clustr_mm classifier keys.

    Returns:
        The converted state dict (``backbone.*`` and ``head.fc.*``) and the
        official keys no rule matched.
    """
    converted, unmatched = OrderedDict(), []
    for key, value in strip_module_prefix(official).items():
        for pattern, rename in _RULES:
            match = pattern.match(key)
            if match:
                converted[rename(match)] = value
                break
        else:
            unmatched.append(key)
    return converted, unmatched


def clustr_official_layout(state: Mapping) -> Optional[str]:
    """:data:`OFFICIAL` if ``state`` (a state dict) is the official code's,
    else None."""
    state = strip_module_prefix(state)
    return OFFICIAL if all(k in state for k in SIGNATURE) else None


def clustr_legacy_layout(state: Mapping) -> Optional[str]:
    """:data:`LEGACY` if ``state`` has ClusTR keys of clustr_mm's earlier
    layout (``patch_embeds.i``, ``stages.i.j``, ``norms.i``; bare or under
    ``backbone.``), else None."""
    bare = [k[len('backbone.'):] if k.startswith('backbone.') else k
            for k in strip_module_prefix(state)]
    return LEGACY if ClusTR.upgrade_state_dict(
        dict.fromkeys(bare)).keys() != set(bare) else None


def convert_clustr_legacy(
        state: Mapping[str, torch.Tensor]
) -> Tuple['OrderedDict[str, torch.Tensor]', List[str]]:
    """Earlier clustr_mm ClusTR keys -> today's, under ``backbone.`` (a
    classifier's ``head.*`` and other keys of a whole model keep their
    names). The same rules load such files into a ClusTR directly
    (``ClusTR.upgrade_state_dict``). Returns the dict and (no) unmatched
    keys, as the other converters do."""
    state = strip_module_prefix(state)
    whole = any(k.startswith('backbone.') for k in state)
    backbone = {k[len('backbone.'):] if whole else k: v
                for k, v in state.items()
                if not whole or k.startswith('backbone.')}
    out = OrderedDict((f'backbone.{k}', v) for k, v in
                      ClusTR.upgrade_state_dict(backbone).items())
    if whole:
        out.update((k, v) for k, v in state.items()
                   if not k.startswith('backbone.'))
    return out, []


def infer_clustr_config(converted: Mapping[str, torch.Tensor]) -> dict:
    """``ClusTR`` kwargs of converted weights (``backbone.*`` keys): the
    arch_zoo entry whose depths and widths they have."""
    depths, dims = [], []
    for i in range(4):
        blocks = {
            int(k.split('.')[4]) for k in converted
            if k.startswith(f'backbone.stages.{i}.blocks.')
        }
        depths.append(len(blocks))
        weight = converted.get(f'backbone.stages.{i}.downsample.proj.weight')
        dims.append(None if weight is None else int(weight.shape[0]))
    for name, arch in ClusTR.arch_zoo.items():
        if list(arch['depths']) == depths and list(arch['embed_dims']) == dims:
            return dict(arch=name)
    raise ValueError(f'no ClusTR arch has depths {depths} and embed dims '
                     f'{dims}; pass the arch explicitly')

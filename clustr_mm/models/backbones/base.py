"""The plumbing every clustr_mm backbone shares, written once.

:class:`PyramidBackbone` holds what ClusTR and PaCaViT do alike around their
own architecture: the arch table (``arch`` as a zoo name or a dict), the
``out_indices`` / ``frozen_stages`` / ``norm_eval`` options, ``train()``
re-applying the freezing, and ``init_weights`` (the official from-scratch
init, then ``init_cfg``, a ``Pretrained`` entry loaded last). A backbone
names its frozen modules (:meth:`PyramidBackbone._frozen_modules`) and which
norm layers ``norm_eval`` affects; :func:`per_stage_reducers` expands the
``reducers`` argument of both.
"""
import copy
import math
from functools import partial
from typing import (Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    Type, Union)

from mmengine.model import BaseModule
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...checkpoints.loading import init_backbone_weights
from ..layers.reducers import PointwiseConv


def parse_arch(arch: Union[str, dict], arch_zoo: Mapping[str, dict],
               required: Sequence[str], defaults: Mapping[str, Sequence],
               num_stages: Optional[int] = None,
               optional: Sequence[str] = ()) -> dict:
    """Settings of a named arch of ``arch_zoo`` or of an arch dict.

    A dict must have every ``required`` key and no key other than those,
    ``defaults`` (which fill what it leaves out) and ``optional`` (kept as
    given, unchecked). Every required and defaulted entry becomes a tuple of
    one value per stage (``num_stages``, or as many as ``depths`` has), and
    every stage's ``embed_dims`` must divide by its ``num_heads``.
    """
    if isinstance(arch, str):
        if arch not in arch_zoo:
            raise ValueError(f'arch must be one of {sorted(arch_zoo)} or a '
                             f'dict, got {arch!r}')
        settings = copy.deepcopy(dict(arch_zoo[arch]))
    elif isinstance(arch, dict):
        settings = copy.deepcopy(dict(arch))
        known = [*required, *defaults, *optional]
        unknown = sorted(set(settings) - set(known))
        if unknown:
            raise ValueError(f'arch dict has unknown keys {unknown}; it takes '
                             f'{known}')
        missing = [k for k in required if k not in settings]
        if missing:
            raise ValueError(f'arch dict is missing keys {missing}; it needs '
                             f'{list(required)}')
    else:
        raise ValueError(f'arch must be a str or dict, got {type(arch)}')
    for key, value in defaults.items():
        settings.setdefault(key, value)
    n = len(settings['depths']) if num_stages is None else num_stages
    for key in list(required) + list(defaults):
        settings[key] = tuple(settings[key])
        if len(settings[key]) != n:
            raise ValueError(f'arch {key!r} has {len(settings[key])} entries, '
                             f'needs {n} (one per stage): {settings[key]}')
    for i, (dim, heads) in enumerate(
            zip(settings['embed_dims'], settings['num_heads'])):
        if dim % heads:
            raise ValueError(f'arch embed_dims[{i}]={dim} is not divisible '
                             f'by num_heads[{i}]={heads}')
    return settings


def parse_out_indices(out_indices: Union[int, Sequence[int]],
                      num_stages: int) -> Tuple[int, ...]:
    """Sorted, non-negative stage indices; negative ones count from the end."""
    if isinstance(out_indices, int):
        out_indices = [out_indices]
    parsed = set()
    for idx in out_indices:
        if not isinstance(idx, int) or not -num_stages <= idx < num_stages:
            raise ValueError(f'out_indices entry {idx!r} is out of range for '
                             f'{num_stages} stages')
        parsed.add(idx % num_stages)
    if not parsed:
        raise ValueError('out_indices must name at least one stage')
    return tuple(sorted(parsed))


def per_stage_reducers(reducers: Union[dict, Sequence[Optional[dict]]],
                       active: Sequence[bool]) -> List[Optional[dict]]:
    """One reducer config (None: full attention) per stage.

    A dict is used (copied) in every ``active`` stage; a sequence gives one
    dict or None per stage.
    """
    if isinstance(reducers, dict):
        return [copy.deepcopy(dict(reducers)) if on else None
                for on in active]
    if isinstance(reducers, str) or not isinstance(reducers, Sequence):
        raise ValueError('reducers must be a dict, a sequence of dicts / '
                         f'None or None, got {reducers!r}')
    reducers = list(reducers)
    if len(reducers) != len(active) or not all(
            r is None or isinstance(r, dict) for r in reducers):
        raise ValueError(f'reducers needs {len(active)} entries, each a dict '
                         f'or None, got {reducers!r}')
    return [None if r is None else copy.deepcopy(dict(r)) for r in reducers]


def official_init(m: nn.Module, pointwise_as_conv: bool = True) -> None:
    """The released models' from-scratch init (timm-style ViT init).

    Linears: truncated normal (std 0.02); norms: weight 1, bias 0; convs:
    He normal over the fan-out of one group. :class:`PointwiseConv` (a 1x1
    conv stored as a linear) is initialised as the conv it stands for when
    ``pointwise_as_conv``, else as a linear.
    """
    if pointwise_as_conv and isinstance(m, PointwiseConv):
        nn.init.normal_(m.weight, 0, math.sqrt(2.0 / m.out_features))
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, (nn.LayerNorm, _BatchNorm)):
        if m.weight is not None:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.Conv2d):
        fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
        nn.init.normal_(m.weight, 0, math.sqrt(2.0 * m.groups / fan_out))
        if m.bias is not None:
            nn.init.zeros_(m.bias)


class PyramidBackbone(BaseModule):
    """Base of the multi-stage backbones (not registered, not built alone).

    Subclasses set ``arch_zoo``, ``norm_eval_types`` (the norm layers
    ``norm_eval`` keeps in eval mode) and ``init_pointwise_as_conv`` (see
    :func:`official_init`), call :meth:`_set_stage_options` in ``__init__``,
    end it with ``self.train(self.training)`` and implement
    :meth:`_frozen_modules`.
    """

    arch_zoo: Dict[str, dict] = {}
    norm_eval_types: Tuple[Type[nn.Module], ...] = (_BatchNorm, )
    init_pointwise_as_conv: bool = True

    def _set_stage_options(self, num_stages: int,
                           out_indices: Union[int, Sequence[int]],
                           frozen_stages: int, norm_eval: bool,
                           drop_path_rate: float) -> None:
        """Check and store the options every backbone has."""
        self.out_indices = parse_out_indices(out_indices, num_stages)
        if not -1 <= frozen_stages <= num_stages:
            raise ValueError(f'frozen_stages must be in [-1, {num_stages}], '
                             f'got {frozen_stages}')
        if not 0.0 <= drop_path_rate < 1.0:
            raise ValueError('drop_path_rate must be in [0, 1), got '
                             f'{drop_path_rate}')
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval

    def _frozen_modules(self) -> Iterable[nn.Module]:
        """The modules ``frozen_stages`` freezes."""
        raise NotImplementedError

    def train(self, mode: bool = True):
        """``nn.Module.train(mode)``, which undoes the freezing, then freeze.

        Frozen modules go to eval mode without gradients; with ``norm_eval``
        in training mode every ``norm_eval_types`` layer is put in eval mode
        too (frozen running statistics, as mmdet/mmseg backbones do).
        """
        super().train(mode)
        for module in self._frozen_modules():
            module.eval()
            for param in module.parameters():
                param.requires_grad = False
        if self.training and self.norm_eval:
            for m in self.modules():
                if isinstance(m, self.norm_eval_types):
                    m.eval()
        return self

    def init_weights(self) -> None:
        """Official init, then ``init_cfg`` (:func:`init_backbone_weights`)."""
        init_backbone_weights(
            self, partial(official_init,
                          pointwise_as_conv=self.init_pointwise_as_conv))

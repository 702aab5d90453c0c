"""The plumbing every clustr_mm backbone shares, written once.

:class:`PyramidBackbone` holds what ClusTR and PaCaViT do alike around their
own architecture: the arch table (``arch`` as a zoo name or a dict), the
``out_indices`` / ``frozen_stages`` / ``norm_eval`` / ``with_cp`` /
``keep_assignments`` options, the forward pass (a loop over
:class:`~.stage.PyramidStage` modules with the input and output checks),
``train()`` re-applying the freezing, and ``init_weights`` (the official
from-scratch init, then ``init_cfg``, a ``Pretrained`` entry loaded last).
:func:`per_stage_reducers` expands the ``reducers`` argument of both.
"""
import copy
import math
from functools import partial
from typing import (Dict, Iterable, List, Mapping, Optional, Sequence, Tuple,
                    Type, Union)

import torch
from mmengine.model import BaseModule
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..layers.reducers import PointwiseConv
from .checks import (check_bool, check_hidden_width, check_images,
                     check_int, check_per_stage, check_stage_output)
from .pretrained import init_backbone_weights
from .stage import PyramidStage, drop_path_rates


# smallest value and whether ints are required, per arch key
ARCH_VALUES = dict(embed_dims=(1, True), num_heads=(1, True),
                   depths=(1, True), teacher_depths=(1, True),
                   mlp_ratios=(1e-9, False), sr_ratios=(1, True))


def parse_arch(arch: Union[str, dict], arch_zoo: Mapping[str, dict],
               required: Sequence[str], defaults: Mapping[str, Sequence],
               num_stages: Optional[int] = None,
               optional: Sequence[str] = ()) -> dict:
    """Settings of a named arch of ``arch_zoo`` or of an arch dict.

    A dict must have every ``required`` key and no key other than those,
    ``defaults`` (which fill what it leaves out) and ``optional``. Every
    entry becomes a tuple of one value per stage (``num_stages``, or as many
    as ``depths`` has), checked against :data:`ARCH_VALUES` (a stage has at
    least one block, head and channel; ``mlp_ratios`` are positive), and
    every stage's ``embed_dims`` must divide by its ``num_heads``, and its
    ``mlp_ratios`` must leave the MLP at least one hidden channel.
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
    depths = settings['depths']
    n = num_stages
    if n is None:
        n = (len(depths) if isinstance(depths, Sequence)
             and not isinstance(depths, str) else None)
    for key in list(required) + list(defaults):
        minimum, integer = ARCH_VALUES.get(key, (1, True))
        settings[key] = check_per_stage(f'arch {key!r}', settings[key], n,
                                        minimum, integer)
    for key in optional:
        if key in settings and key in ARCH_VALUES:
            minimum, integer = ARCH_VALUES[key]
            settings[key] = check_per_stage(f'arch {key!r}', settings[key],
                                            n, minimum, integer)
    for i, (dim, heads) in enumerate(
            zip(settings['embed_dims'], settings['num_heads'])):
        if dim % heads:
            raise ValueError(f'arch embed_dims[{i}]={dim} is not divisible '
                             f'by num_heads[{i}]={heads}')
    for i, (dim, ratio) in enumerate(
            zip(settings['embed_dims'], settings.get('mlp_ratios', ()))):
        check_hidden_width(f'arch mlp_ratios[{i}]', dim, ratio)
    return settings


def parse_out_indices(out_indices: Union[int, Sequence[int]],
                      num_stages: int) -> Tuple[int, ...]:
    """Sorted, non-negative stage indices; negative ones count from the end."""
    if isinstance(out_indices, int) and not isinstance(out_indices, bool):
        out_indices = [out_indices]
    parsed = set()
    if isinstance(out_indices, (str, bytes)) or not isinstance(
            out_indices, Sequence):
        raise ValueError('out_indices must be an int or a sequence of ints, '
                         f'got {out_indices!r}')
    for idx in out_indices:
        if (isinstance(idx, bool) or not isinstance(idx, int)
                or not -num_stages <= idx < num_stages):
            raise ValueError(f'out_indices entry {idx!r} is not a stage index '
                             f'(an int in [-{num_stages}, {num_stages - 1}])')
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

    The construction protocol: a subclass sets ``arch_zoo`` (its arch
    table), ``norm_eval_types`` (the norm layers ``norm_eval`` keeps in eval
    mode) and ``init_pointwise_as_conv`` (see :func:`official_init`). Its
    ``__init__`` reads its arch and its own options, setting ``depths`` (the
    blocks per stage), then calls :meth:`build_pyramid` once, which checks
    the options every backbone has, calls :meth:`make_stem` (what comes
    before the stages; nothing by default) and :meth:`make_stage` per stage
    (a :class:`~.stage.PyramidStage`, given its blocks' drop-path rates),
    and applies ``with_cp``, ``keep_assignments`` and the freezing. It
    implements :meth:`make_stage`, :meth:`_frozen_modules` and, if something
    runs before the stages, :meth:`forward_stem`.
    """

    arch_zoo: Dict[str, dict] = {}
    # each stage's output stride (the pose config check reads it to know
    # which heatmap size a head on these maps produces)
    strides: Tuple[int, ...] = (4, 8, 16, 32)
    norm_eval_types: Tuple[Type[nn.Module], ...] = (_BatchNorm, )
    init_pointwise_as_conv: bool = True
    depths: List[int]

    def build_pyramid(self, *, in_channels: int,
                      out_indices: Union[int, Sequence[int]],
                      frozen_stages: int, norm_eval: bool,
                      drop_path_rate: float, with_cp: bool,
                      keep_assignments: bool) -> None:
        """Check and store the options every backbone has, build the stem
        and the stages, then apply the options that reach into them."""
        self._check_options(len(self.depths), in_channels, out_indices,
                            frozen_stages, norm_eval, drop_path_rate)
        self.make_stem()
        rates = drop_path_rates(drop_path_rate, self.depths)
        self.stages = nn.ModuleList(
            self.make_stage(i, rates[i]) for i in range(len(self.depths)))
        self.with_cp = with_cp
        self.keep_assignments = keep_assignments
        self.train(self.training)  # frozen_stages and norm_eval from the start

    def make_stem(self) -> None:
        """Build what comes before the stages (none by default)."""

    def make_stage(self, i: int, drop_path: List[float]) -> PyramidStage:
        """Stage ``i`` (0-based), its blocks with the ``drop_path`` rates."""
        raise NotImplementedError

    def _check_options(self, num_stages: int, in_channels: int,
                       out_indices: Union[int, Sequence[int]],
                       frozen_stages: int, norm_eval: bool,
                       drop_path_rate: float) -> None:
        self.in_channels = check_int('in_channels', in_channels, 1)
        self.out_indices = parse_out_indices(out_indices, num_stages)
        frozen_stages = check_int('frozen_stages', frozen_stages, -1)
        if frozen_stages > num_stages:
            raise ValueError(f'frozen_stages must be in [-1, {num_stages}], '
                             f'got {frozen_stages}')
        if (isinstance(drop_path_rate, bool)
                or not isinstance(drop_path_rate, (int, float))
                or not 0.0 <= drop_path_rate < 1.0):
            raise ValueError('drop_path_rate must be a number in [0, 1), got '
                             f'{drop_path_rate!r}')
        self.frozen_stages = frozen_stages
        self.norm_eval = check_bool('norm_eval', norm_eval)

    @property
    def with_cp(self) -> bool:
        """Checkpoint every block (see :class:`~.stage.PyramidStage`): the
        blocks' activations are recomputed in the backward pass instead of
        kept, which saves memory for the time of one more forward."""
        return self._with_cp

    @with_cp.setter
    def with_cp(self, on: bool) -> None:
        if not isinstance(on, bool):
            raise ValueError(f'with_cp must be True or False, got {on!r}')
        self._with_cp = on
        for stage in self.stages:
            stage.with_cp = on

    @property
    def keep_assignments(self) -> bool:
        """Record the cluster assignments of every forward in
        :attr:`assignments` (for visualisation; off: nothing is kept)."""
        return self._keep_assignments

    @keep_assignments.setter
    def keep_assignments(self, on: bool) -> None:
        if not isinstance(on, bool):
            raise ValueError('keep_assignments must be True or False, got '
                             f'{on!r}')
        self._keep_assignments = on
        for stage in self.stages:
            stage.keep_assignments = on
            stage.assignments = []

    @property
    def assignments(self) -> List[List[List[torch.Tensor]]]:
        """With :attr:`keep_assignments`, the last forward's assignments:
        ``[stage][block][scale]``, each a detached map on the stage's grid,
        (B, H, W) cluster ids (DPC-kNN and other hard reducers) or
        (B, M, H, W) soft weights (PaCa); no scales for full attention.
        Empty when not kept."""
        if not self._keep_assignments:
            return []
        return [stage.assignments for stage in self.stages]

    def _frozen_modules(self) -> Iterable[nn.Module]:
        """The modules ``frozen_stages`` freezes."""
        raise NotImplementedError

    def forward_stem(self, images: torch.Tensor
                     ) -> Tuple[torch.Tensor, List[tuple]]:
        """What runs before the stages: the first stage's input and, per
        stage, the extra arguments of its forward (none by default)."""
        return images, [()] * len(self.stages)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """(B, in_channels, H, W) images -> the ``out_indices`` stages' maps,
        (B, C_i, H_i, W_i) at strides 4, 8, 16, 32."""
        check_images(x, self.in_channels, type(self).__name__)
        images = x
        x, stage_args = self.forward_stem(images)
        outs = []
        for i, stage in enumerate(self.stages):
            x = stage(x, *stage_args[i])
            check_stage_output(self, i, x, images)
            if i in self.out_indices:
                # standard NCHW: necks and heads (mmcv's CPU RoIAlign) read
                # a channels-last map as NCHW
                outs.append(x.contiguous())
        return tuple(outs)

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

    @classmethod
    def upgrade_state_dict(cls, state_dict: Mapping[str, torch.Tensor]
                           ) -> Dict[str, torch.Tensor]:
        """A state dict of an older layout of this backbone in today's key
        names (keys of the current layout pass unchanged)."""
        return dict(state_dict)

    def init_weights(self) -> None:
        """Official init, then ``init_cfg`` (:func:`init_backbone_weights`)."""
        init_backbone_weights(
            self, partial(official_init,
                          pointwise_as_conv=self.init_pointwise_as_conv))

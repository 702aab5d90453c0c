"""ClusTR backbone ("ClusTR: Exploring efficient self-attention via
clustering for vision transformers"): a four-stage pyramid whose attention
takes its keys/values from DPC-kNN cluster tokens (or, per stage, from any
registered token reducer: ``reducers``).
"""
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ...ops.dpc_knn import CLUSTR_SCALES
from ...registry import register_model
from ..layers import ClusterAttention, ConvFFN, DropPath, OverlapPatchEmbed
from .base import PyramidBackbone, parse_arch, per_stage_reducers
from ..layers.token_reducer import reducer_accepts
from .checks import check_bool, check_int, warn_unused
from .stage import BlockOutput, PyramidStage

# The earlier checkpoint key layout (patch_embeds.i, stages.i.j, norms.i):
# such checkpoints must keep loading.
_LEGACY_KEYS = [
    (re.compile(r'^patch_embeds\.(\d+)\.'), r'stages.\1.downsample.'),
    (re.compile(r'^stages\.(\d+)\.(\d+)\.'), r'stages.\1.blocks.\2.'),
    (re.compile(r'^norms\.(\d+)\.'), r'stages.\1.norm.'),
]


class ClusTRBlock(nn.Module):
    """Pre-norm block: x + DropPath(Attn(LN(x))), x + DropPath(MLP(LN(x))).

    ``sr_ratio``, ``window_size``, ``max_chunk_elems``, ``reducer`` and
    ``compact_qv`` go to :class:`ClusterAttention`.
    """

    def __init__(self, dim: int, *, num_heads: int, mlp_ratio: float,
                 sr_ratio: int, drop_path: float = 0.0,
                 window_size: Optional[int] = None,
                 max_chunk_elems: Optional[int] = None,
                 reducer: Union[dict, None, str] = 'default',
                 compact_qv: bool = False):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = ClusterAttention(
            dim, num_heads, sr_ratio, window_size=window_size,
            max_chunk_elems=max_chunk_elems, reducer=reducer,
            compact_qv=compact_qv)
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ConvFFN(dim, int(dim * mlp_ratio))

    def forward(self, x: torch.Tensor, hw: Tuple[int, int],
                assignment: Optional[torch.Tensor] = None) -> BlockOutput:
        """(tokens, grid, assignment) -> :class:`BlockOutput`: ClusTR blocks
        cluster on their own and pass a stage's assignment on unchanged."""
        out, used = self.attn(self.norm1(x), hw)
        x = x + self.drop_path(out)
        x = x + self.drop_path(self.mlp(self.norm2(x), hw))
        return BlockOutput(x, assignment, used)


@register_model
class ClusTR(PyramidBackbone):
    """ClusTR vision backbone; returns NCHW maps at strides 4, 8, 16, 32.

    Stage i: overlapping patch embedding (7x7/4, then 3x3/2; LayerNorm eps
    1e-5), ``depths[i]`` blocks with clustering attention (full attention
    where ``sr_ratio`` is 1), then a LayerNorm (eps 1e-6).

    Args:
        arch (str | dict): 'tiny', 'small', 'base' or a dict with keys
            ``embed_dims``, ``depths``, ``num_heads``, ``mlp_ratios`` (one
            entry per stage) and optionally ``sr_ratios`` (default 8, 4, 2, 1).
        in_channels (int): Input image channels. Default 3.
        out_indices (Sequence[int]): Stages whose maps are returned.
        clustering_mode (str): 'exact' clusters all tokens of an image
            together (the official algorithm; quadratic in tokens, for
            ImageNet-sized inputs). 'window' clusters within windows of
            ``window_size`` tokens and keeps keys/values global (dense
            prediction at any resolution). Both agree whenever one window
            covers a stage's grid, e.g. at 224x224 input.
        window_size (int | Sequence[int], optional): Window side in tokens,
            for 'window' mode (given with 'exact' mode, it is unused and a
            warning says so). An int is the stage-1 size, halved per stage
            (56 gives 56, 28, 14: the grids of a 224x224 image); a sequence
            gives one size per stage. Default None: 56.
        drop_path_rate (float): Stochastic depth rate, linearly increasing
            over blocks. Default 0.
        frozen_stages (int): Freeze (eval mode, no gradient) the first
            patch embedding and this many whole stages, as PaCaViT, Swin and
            ResNet count: 0 freezes only the stem-like first patch embedding,
            1 also the first stage; -1 freezes nothing. Default -1.
        norm_eval (bool): Keep norm layers in eval mode while training. ClusTR
            only has LayerNorms, whose output does not depend on the mode; the
            option exists for configs shared with BatchNorm backbones.
        max_chunk_elems (int, optional): Largest distance-matrix chunk of the
            clustering, in elements; bounds its memory. Default None: 2**28
            (1 GiB of fp32 distances) on every device.
        reducers (dict | Sequence[dict | None], optional): The key/value
            token reducer per stage (see ``layers/token_reducer.py``). A dict is
            used in every stage whose ``sr_ratio`` is > 1 (full attention
            where it is 1); a sequence gives one entry per stage, None
            meaning full attention. Each reducer is offered the stage's
            ``dim``, ``sr_ratio``, ``num_heads`` and, in 'window' mode, its
            ``window_size`` (plus ``max_chunk_elems``) unless its config sets
            them. Default None: ClusTR, i.e. ``dict(type='DPCKNN',
            scale_factors=CLUSTR_SCALES)`` (1, 4). E.g. ``dict(type='GridPool')`` is PVT's
            spatial-reduction attention, ``dict(type='DPCKNN',
            scale_factors=(1, ))`` single-scale clustering.
        compact_qv (bool): Armour compact attention: values come from the
            query projection (one C x C projection fewer per scale and
            block). Default False.
        with_cp (bool): Gradient checkpointing of every block: less memory
            in training for one more forward of the blocks (the clustering
            is recomputed from the same input, so it is the same). Default
            False.
        keep_assignments (bool): Record each forward's cluster ids in
            ``self.assignments`` (for visualisation). Default False.
        init_cfg (dict | list[dict], optional): MMEngine init config, e.g.
            ``dict(type='Pretrained', checkpoint=..., prefix='backbone.')``.
            Without one, the official initialisation is used.
    """

    arch_zoo: Dict[str, dict] = {
        'tiny': dict(embed_dims=(64, 128, 256, 512), depths=(1, 2, 6, 1),
                     num_heads=(1, 2, 4, 8), mlp_ratios=(8, 8, 4, 4)),
        'small': dict(embed_dims=(64, 128, 256, 512), depths=(3, 5, 13, 2),
                      num_heads=(1, 2, 4, 8), mlp_ratios=(8, 8, 4, 4)),
        'base': dict(embed_dims=(64, 128, 320, 512), depths=(3, 5, 18, 3),
                     num_heads=(1, 2, 5, 8), mlp_ratios=(8, 8, 4, 4)),
    }
    essential_keys = ('embed_dims', 'depths', 'num_heads', 'mlp_ratios')
    default_sr_ratios = (8, 4, 2, 1)
    clustering_modes = ('exact', 'window')
    default_window_size = 56
    # LayerNorms only (modes do not differ); BN/GN for configs shared with
    # other backbones
    norm_eval_types = (_BatchNorm, nn.LayerNorm, nn.GroupNorm)
    # The official ClusTR has no 1x1 convs: a PaCa reducer's PointwiseConv
    # is initialised as the linear it is.
    init_pointwise_as_conv = False

    def __init__(self,
                 arch: Union[str, dict] = 'tiny',
                 in_channels: int = 3,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 clustering_mode: str = 'exact',
                 window_size: Union[int, Sequence[int], None] = None,
                 drop_path_rate: float = 0.0,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 max_chunk_elems: Optional[int] = None,
                 reducers: Union[dict, Sequence[Optional[dict]], None] = None,
                 compact_qv: bool = False,
                 with_cp: bool = False,
                 keep_assignments: bool = False,
                 init_cfg: Optional[Union[dict, list]] = None):
        super().__init__(init_cfg=init_cfg)
        settings = self._parse_arch(arch)
        self.embed_dims = list(settings['embed_dims'])
        self.depths = list(settings['depths'])
        self.num_heads = list(settings['num_heads'])
        self.mlp_ratios = list(settings['mlp_ratios'])
        self.sr_ratios = list(settings['sr_ratios'])
        self.num_stages = len(self.depths)
        if clustering_mode not in self.clustering_modes:
            raise ValueError(
                f'clustering_mode must be one of {self.clustering_modes}, '
                f'got {clustering_mode!r}')
        self.clustering_mode = clustering_mode
        self.window_sizes = self._parse_window_size(
            self.default_window_size if window_size is None else window_size)
        if max_chunk_elems is not None:
            check_int('max_chunk_elems', max_chunk_elems, 1)
        self.max_chunk_elems = max_chunk_elems
        self.reducers = self._parse_reducers(reducers)
        self.compact_qv = check_bool('compact_qv', compact_qv)
        self._warn_unused(window_size, max_chunk_elems)
        self.build_pyramid(in_channels=in_channels, out_indices=out_indices,
                           frozen_stages=frozen_stages, norm_eval=norm_eval,
                           drop_path_rate=drop_path_rate, with_cp=with_cp,
                           keep_assignments=keep_assignments)

    def make_stage(self, i: int, drop_path: List[float]) -> PyramidStage:
        """A row of the arch table: patch embedding (7x7/4 first, then
        3x3/2), ``depths[i]`` blocks, LayerNorm."""
        dim, first = self.embed_dims[i], i == 0
        window = (self.window_sizes[i] if self.clustering_mode == 'window'
                  else None)
        return PyramidStage(
            OverlapPatchEmbed(self.in_channels if first else
                              self.embed_dims[i - 1], dim,
                              kernel_size=7 if first else 3,
                              stride=4 if first else 2),
            [ClusTRBlock(dim, num_heads=self.num_heads[i],
                         mlp_ratio=self.mlp_ratios[i],
                         sr_ratio=self.sr_ratios[i], drop_path=rate,
                         window_size=window,
                         max_chunk_elems=self.max_chunk_elems,
                         reducer=self.reducers[i],
                         compact_qv=self.compact_qv)
             for rate in drop_path],
            dim)

    def _parse_arch(self, arch: Union[str, dict]) -> dict:
        return parse_arch(arch, self.arch_zoo, self.essential_keys,
                          dict(sr_ratios=self.default_sr_ratios))

    def _parse_window_size(self, window_size) -> list:
        if isinstance(window_size, int) and not isinstance(window_size, bool):
            check_int('window_size', window_size, 1)
            sizes = [max(1, window_size >> i) for i in range(self.num_stages)]
        elif isinstance(window_size, Sequence) and not isinstance(
                window_size, str):
            sizes = list(window_size)
            if len(sizes) != self.num_stages or any(
                    isinstance(s, bool) or not isinstance(s, int) or s < 1
                    for s in sizes):
                raise ValueError(
                    f'window_size must be a positive int or {self.num_stages}'
                    f' positive ints (one per stage), got {window_size!r}')
        else:
            raise ValueError(
                f'window_size must be a positive int (stage 1, halved per '
                f'stage) or {self.num_stages} positive ints, got '
                f'{window_size!r}')
        for i, (size, sr) in enumerate(zip(sizes, self.sr_ratios)):
            # A window must hold at least one coarse cluster's worth of
            # tokens (sr x sr), or it would ask for more clusters than tokens.
            if sr > 1 and size < sr:
                raise ValueError(
                    f'window_size for stage {i} is {size} tokens, smaller '
                    f'than its sr_ratio {sr}: windows would hold fewer tokens '
                    'than one cluster stands for')
        return sizes

    def _warn_unused(self, window_size, max_chunk_elems) -> None:
        """Name the stage options that no part of this model reads."""
        takes = [reducer_accepts(r) for r in self.reducers if r is not None]
        if window_size is not None:
            if self.clustering_mode == 'exact':
                warn_unused('window_size', window_size,
                            "clustering_mode='exact' clusters whole images "
                            "(set clustering_mode='window' to use windows)")
            elif not any('window_size' in t for t in takes):
                warn_unused('window_size', window_size,
                            'no reducer of this model clusters in windows')
        if max_chunk_elems is not None and not any(
                'max_chunk_elems' in t for t in takes):
            warn_unused('max_chunk_elems', max_chunk_elems,
                        'no reducer of this model computes distance chunks')

    def _parse_reducers(self, reducers) -> List[Optional[dict]]:
        """One reducer config (or None: full attention) per stage."""
        if reducers is None:
            reducers = dict(type='DPCKNN', scale_factors=CLUSTR_SCALES)
        return per_stage_reducers(reducers, [sr > 1 for sr in self.sr_ratios])

    def _frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        return [self.stages[0].downsample, *self.stages[:self.frozen_stages]]

    @classmethod
    def upgrade_state_dict(cls, state_dict: Mapping[str, torch.Tensor]
                           ) -> Dict[str, torch.Tensor]:
        """Old ClusTR keys (``patch_embeds.i``, ``stages.i.j``, ``norms.i``)
        -> today's (``stages.i.downsample``, ``stages.i.blocks.j``,
        ``stages.i.norm``); any other key passes unchanged."""
        upgraded = {}
        for key, value in state_dict.items():
            for pattern, new in _LEGACY_KEYS:
                key, done = pattern.subn(new, key)
                if done:
                    break
            upgraded[key] = value
        return upgraded

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # old checkpoints (saved before the stage modules) load unchanged,
        # whichever loader walks the modules (torch's or MMEngine's)
        legacy = [k for k in state_dict if k.startswith(prefix) and (
            any(p.match(k[len(prefix):]) for p, _ in _LEGACY_KEYS))]
        for key, value in self.upgrade_state_dict(
                {k[len(prefix):]: state_dict.pop(k) for k in legacy}).items():
            state_dict[prefix + key] = value
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

"""PaCa-ViT: Patch-to-Cluster Attention vision transformer (CVPR 2023).

Four stages at strides 4/8/16/32. Each block is a pre-norm transformer block
whose attention goes from the patch tokens to M soft cluster tokens
(``SoftCluster`` in ``layers/reducers.py``); the last stage of the conv/mlp
variants has no clusters and uses full self-attention. The "teacher" variant
computes the assignments of every stage with a small ConvMixer + FPN network
that runs on the stem output and whose stage features are added to the
student's. Any registered token reducer can replace the soft clustering per
stage (``reducers``).
"""
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ...registry import register_model
from ..layers import ConvFFN, DropPath, PaCaAttention, tokens_to_map
from ..layers.token_reducer import reducer_class
from .base import PyramidBackbone, parse_arch, per_stage_reducers
from .checks import check_bool, check_int, check_per_stage, warn_unused
from .stage import BlockOutput, PyramidStage, map_to_tokens

Tokens = Tuple[torch.Tensor, Tuple[int, int]]


class PaCaStem(nn.Module):
    """Two 3x3 stride-2 convs (3 -> C/2 -> C, nothing between) + LayerNorm."""
    flop_kind = 'embedding'

    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, dim // 2, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(dim // 2, dim, 3, stride=2, padding=1)
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> Tokens:
        # channels-last: oneDNN's fast conv path on the CPU, and the output
        # is already in token order
        x = x.contiguous(memory_format=torch.channels_last)
        x = self.conv2(self.conv1(x))
        return self.norm(map_to_tokens(x)), tuple(x.shape[2:])


class PaCaDownsample(nn.Module):
    """Transition between stages: 3x3 stride-2 conv + LayerNorm."""
    flop_kind = 'embedding'

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, 3, stride=2, padding=1)
        self.norm = nn.LayerNorm(out_dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> Tokens:
        x = self.conv(x)
        return self.norm(map_to_tokens(x)), tuple(x.shape[2:])


class PaCaBlock(nn.Module):
    """x + DropPath(PaCa(LN(x))), then x + DropPath(ConvFFN(LN(x))).

    ``reducer``, ``compact_qv`` and ``reducer_context`` go to
    :class:`PaCaAttention`.
    """

    def __init__(self, dim: int, *, num_heads: int, num_clusters: int,
                 clustering: Optional[str], mlp_ratio: int,
                 drop_path: float = 0.0, reducer: Optional[dict] = None,
                 compact_qv: bool = False,
                 reducer_context: Optional[dict] = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = PaCaAttention(
            dim, num_heads, num_clusters, clustering, mlp_ratio=mlp_ratio,
            reducer=reducer, compact_qv=compact_qv,
            reducer_context=reducer_context)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.ffn = ConvFFN(dim, int(dim * mlp_ratio))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int],
                assignment: Optional[torch.Tensor] = None) -> BlockOutput:
        """(tokens, grid, assignment) -> :class:`BlockOutput`, whose
        assignment for the next block of the stage is the one this block
        used (its first scale: fresh if it owns a reducer)."""
        out, used = self.attn(self.norm1(x), hw, assignment)
        x = x + self.drop_path(out)
        x = x + self.drop_path(self.ffn(self.norm2(x), hw))
        return BlockOutput(x, used[0] if used else assignment, used)


class ConvMixerLayer(nn.Module):
    """x + BN(GELU(dwconv_k(x))), then BN(GELU(pwconv(x)))."""

    def __init__(self, dim: int, kernel_size: int = 7):
        super().__init__()
        self.dwconv = nn.Conv2d(
            dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        self.norm1 = nn.BatchNorm2d(dim)
        self.pwconv = nn.Conv2d(dim, dim, 1)
        self.norm2 = nn.BatchNorm2d(dim)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.norm1(self.act(self.dwconv(x)))
        return self.norm2(self.act(self.pwconv(x)))


class ConvGeluBN(nn.Module):
    """conv -> GELU -> BN; with ``blur`` the input is first low-pass filtered
    by the fixed [1 2 1]^T [1 2 1] / 16 kernel (anti-aliased downsampling)."""

    def __init__(self, in_dim: int, out_dim: int, kernel_size: int,
                 stride: int = 1, blur: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(
            in_dim, out_dim, kernel_size, stride, padding=kernel_size // 2)
        self.norm = nn.BatchNorm2d(out_dim)
        self.act = nn.GELU()
        if blur:
            taps = torch.tensor([1., 2., 1.])
            kernel = (taps[:, None] * taps[None, :] / 16).expand(
                in_dim, 1, 3, 3).contiguous()
            self.register_buffer('blur_kernel', kernel, persistent=False)
        else:
            self.blur_kernel = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.blur_kernel is not None:
            x = F.conv2d(x, self.blur_kernel, padding=1, groups=x.shape[1])
        return self.norm(self.act(self.conv(x)))


class ConvMixerTeacher(nn.Module):
    """The "external clustering" network of the teacher variant.

    ConvMixer stages (blur-conv transitions) produce features at the student's
    resolutions; a top-down FPN (upsample, lateral conv, ConvMixer layer)
    mixes them, and a 1x1 conv per clustered stage turns the FPN output into
    cluster logits, soft-maxed over the tokens. BatchNorm throughout.

    Args:
        embed_dims (Sequence[int]): Channels per stage (the student's).
        depths (Sequence[int]): ConvMixer layers per stage.
        num_clusters (Sequence[int]): Clusters per stage (0: none).
        kernel_size (int): Depthwise kernel size. Default: 7.
    """
    flop_kind = 'clustering'

    def __init__(self, embed_dims: Sequence[int], depths: Sequence[int],
                 num_clusters: Sequence[int], kernel_size: int = 7):
        super().__init__()
        n = len(embed_dims)
        self.stages = nn.ModuleList(
            nn.Sequential(*[ConvMixerLayer(dim, kernel_size)
                            for _ in range(depth)])
            for dim, depth in zip(embed_dims, depths))
        self.downsamples = nn.ModuleList(
            ConvGeluBN(embed_dims[i], embed_dims[i + 1], 3, 2, blur=True)
            for i in range(n - 1))
        for down in self.downsamples:  # the teacher's own patch embeddings
            down.flop_kind = 'embedding'
        self.laterals = nn.ModuleList(
            ConvGeluBN(embed_dims[i + 1], embed_dims[i], 1)
            for i in range(n - 1))
        self.fpns = nn.ModuleList(
            ConvMixerLayer(embed_dims[i], kernel_size) for i in range(n - 1))
        self.to_clusters = nn.ModuleDict({
            str(i): nn.Conv2d(embed_dims[i], m, 1)
            for i, m in enumerate(num_clusters) if m > 0
        })

    def forward(self, x: torch.Tensor):
        """Stem features (B, C, H, W) -> (per-stage assignments (B, M, N) or
        None, per-stage features (B, C_i, H_i, W_i))."""
        feats = []
        for i, stage in enumerate(self.stages):
            if i > 0:
                x = self.downsamples[i - 1](x)
            x = stage(x)
            feats.append(x)
        fused = [None] * len(feats)
        fused[-1] = feats[-1]
        for i in range(len(feats) - 2, -1, -1):
            up = F.interpolate(fused[i + 1], size=feats[i].shape[2:],
                               mode='bilinear', align_corners=False)
            fused[i] = self.fpns[i](feats[i] + self.laterals[i](up))
        assignments = [None] * len(feats)
        for key, to_clusters in self.to_clusters.items():
            i = int(key)
            assignments[i] = to_clusters(fused[i]).flatten(2).softmax(dim=-1)
        return assignments, feats


@register_model
class PaCaViT(PyramidBackbone):
    """PaCa-ViT backbone.

    Args:
        arch (str | dict): 'tiny', 'small', 'base', or a dict with
            ``embed_dims``, ``num_heads``, ``depths`` (4 entries each),
            optional ``mlp_ratios`` (default 4) and, for the teacher
            variant, ``teacher_depths``. With ``clustering='teacher'`` the
            named archs use the official teacher depths (fewer student
            blocks, e.g. small: 3,3,7,3 + teacher 2,2,2,2).
        clustering (str, optional): How cluster assignments are computed:
            'conv' (depthwise 7x7 conv net; None means it), 'mlp' (per-token
            MLP) or 'teacher' (ConvMixer + FPN network for all stages).
            When ``reducers`` gives every clustered stage its own reducer the
            network is not built: 'mlp' is then refused and 'conv' (the
            default, e.g. from a base config) warned about.
        num_clusters (Sequence[int], optional): Clusters per stage; 0 means
            plain full self-attention. Default: (100, 100, 100, 0), or
            100 in every stage for the teacher variant.
        clustering_interval (int): Which blocks compute their own assignment
            (conv/mlp). 0: only the first block of each stage; later blocks
            apply its assignment to their own normalised input (default, as
            released). k >= 1: every k-th block (1 = per block).
        in_channels (int): Input image channels. Default: 3.
        out_indices (Sequence[int]): Stages whose (normalised) outputs are
            returned; negative indices count from the end. Default: all.
        frozen_stages (int): Freeze the stem and this many stages (-1: none).
            The teacher mixes all stages, so it is frozen whenever any stage
            is.
        norm_eval (bool): Keep BatchNorm layers (teacher) in eval mode while
            training. Default: False.
        drop_path_rate (float): Stochastic depth, linearly increasing over
            the student blocks. The released ImageNet models used 0.1 (base
            0.5). Default: 0.
        keep_assignments (bool): Record each forward's assignments in
            ``self.assignments`` (for visualisation; may also be set on the
            instance later): per stage and block, the (B, M, H, W) soft
            assignment it used (or (B, H, W) cluster ids of a hard reducer).
            Default False: nothing is kept.
        reducers (dict | Sequence[dict | None], optional): Key/value token
            reducer per stage instead of the soft clustering (see
            ``layers/reducers.py``; not with ``clustering='teacher'``). A
            dict is used in every stage with clusters (``num_clusters`` > 0;
            full attention elsewhere); a sequence gives one entry per stage
            (None: full attention; stages with 0 clusters must have None).
            Each reducer is offered the stage's ``dim``, ``num_heads``,
            ``num_clusters``, ``mlp_ratio`` and ``sr_ratio`` (8, 4, 2, 1),
            unless its config sets them. Reducers that cannot share their
            assignment (all but SoftCluster) get one per block. Default
            None: PaCa, i.e. ``dict(type='SoftCluster', net=clustering)``.
        compact_qv (bool): Armour compact attention: values come from the
            query projection (no ``v`` projection). Default False.
        with_cp (bool): Gradient checkpointing of every student block
            (their clustering nets included): less memory in training for
            one more forward of the blocks. The teacher network is not
            checkpointed (a recomputation would update its BatchNorm
            statistics twice). Default False.
        init_cfg (dict | list, optional): mmengine init config. A
            ``Pretrained`` entry (optionally with ``prefix``) is loaded with
            :func:`~.pretrained.load_backbone_state`, which
            re-initialises layers whose cluster count differs from the
            checkpoint and warns about them.

    Returns from ``forward``: a tuple of (B, C_i, H/2^(i+2), W/2^(i+2)) maps.
    """

    arch_zoo = {
        'tiny': dict(embed_dims=(96, 192, 320, 384), num_heads=(2, 4, 8, 16),
                     depths=(2, 2, 4, 2)),
        'small': dict(embed_dims=(96, 192, 320, 384), num_heads=(2, 4, 8, 16),
                      depths=(3, 3, 10, 3)),
        'base': dict(embed_dims=(96, 192, 384, 512), num_heads=(2, 4, 8, 16),
                     depths=(3, 3, 18, 3)),
    }
    # The teacher variants give up student blocks to pay for the teacher.
    teacher_arch_zoo = {
        'tiny': dict(depths=(2, 2, 2, 2), teacher_depths=(2, 2, 2, 2)),
        'small': dict(depths=(3, 3, 7, 3), teacher_depths=(2, 2, 2, 2)),
        'base': dict(depths=(3, 3, 16, 3), teacher_depths=(2, 2, 4, 2)),
    }
    clusterings = ('conv', 'mlp', 'teacher')
    default_clustering = 'conv'
    num_stages = 4
    # offered to reducers that size their summary by a reduction ratio
    default_sr_ratios = (8, 4, 2, 1)

    def __init__(self,
                 arch: Union[str, Dict] = 'small',
                 clustering: Optional[str] = None,
                 num_clusters: Optional[Sequence[int]] = None,
                 clustering_interval: int = 0,
                 in_channels: int = 3,
                 out_indices: Sequence[int] = (0, 1, 2, 3),
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 drop_path_rate: float = 0.0,
                 keep_assignments: bool = False,
                 reducers: Union[Dict, Sequence[Optional[Dict]], None] = None,
                 compact_qv: bool = False,
                 with_cp: bool = False,
                 init_cfg: Optional[Union[Dict, List[Dict]]] = None):
        super().__init__(init_cfg=init_cfg)
        given_clustering = clustering
        if clustering is None:
            clustering = self.default_clustering
        if clustering not in self.clusterings:
            raise ValueError(f'clustering must be one of {self.clusterings}, '
                             f'got {clustering!r}')
        arch = self.arch_settings(arch, clustering)
        embed_dims, depths = arch['embed_dims'], arch['depths']
        if num_clusters is None:
            num_clusters = (100, ) * 4 if clustering == 'teacher' else (
                100, 100, 100, 0)
        num_clusters = check_per_stage('num_clusters', num_clusters,
                                       self.num_stages, 0)
        check_int('clustering_interval', clustering_interval, 0)
        if clustering == 'teacher' and clustering_interval:
            raise ValueError('clustering_interval does not apply to '
                             "clustering='teacher' (the teacher assigns for "
                             'every block)')

        self.arch = arch
        self.clustering = clustering
        self.clustering_interval = clustering_interval
        self.num_clusters = num_clusters
        self.embed_dims = embed_dims
        self.depths = list(depths)
        self.reducers = self._parse_reducers(reducers, clustering,
                                             num_clusters)
        self.compact_qv = check_bool('compact_qv', compact_qv)
        self._check_unused(given_clustering, reducers, clustering_interval)
        self.build_pyramid(in_channels=in_channels, out_indices=out_indices,
                           frozen_stages=frozen_stages, norm_eval=norm_eval,
                           drop_path_rate=drop_path_rate, with_cp=with_cp,
                           keep_assignments=keep_assignments)

    def make_stem(self) -> None:
        """The stem (stage 1's patch embedding) and, with
        ``clustering='teacher'``, the teacher network."""
        self.stem = PaCaStem(self.in_channels, self.embed_dims[0])
        self.teacher = None
        if self.clustering == 'teacher':
            self.teacher = ConvMixerTeacher(self.embed_dims,
                                            self.arch['teacher_depths'],
                                            self.num_clusters)

    def _owns_reducer(self, i: int, j: int) -> bool:
        """Whether block j of stage i clusters on its own (else it applies
        the assignment of an earlier block or of the teacher)."""
        cls = reducer_class(self.reducers[i])
        if self.clustering == 'teacher':
            return False
        if cls is not None and not cls.shareable:
            return True
        if self.clustering_interval == 0:
            return j == 0
        return j % self.clustering_interval == 0

    def make_stage(self, i: int, drop_path: List[float]) -> PyramidStage:
        """A row of the arch table: downsampling (none in stage 1: the
        stem's map), ``depths[i]`` PaCa blocks, LayerNorm."""
        dim, blocks = self.embed_dims[i], []
        for j, rate in enumerate(drop_path):
            own = self._owns_reducer(i, j)
            blocks.append(PaCaBlock(
                dim, num_heads=self.arch['num_heads'][i],
                num_clusters=self.num_clusters[i],
                clustering=self.clustering if own else None,
                mlp_ratio=self.arch['mlp_ratios'][i], drop_path=rate,
                reducer=self.reducers[i] if own else None,
                compact_qv=self.compact_qv,
                reducer_context=dict(sr_ratio=self.default_sr_ratios[i])))
        downsample = (PaCaDownsample(self.embed_dims[i - 1], dim)
                      if i > 0 else None)  # stage 1 starts at the stem
        return PyramidStage(downsample, blocks, dim)

    def _check_unused(self, clustering: Optional[str], reducers,
                      clustering_interval: int) -> None:
        """Refuse (or, for the default value, warn about) options that no
        block reads once ``reducers`` replace the soft clustering."""
        if reducers is None:
            return
        owned = [reducer_class(r) for r, m in zip(self.reducers,
                                                  self.num_clusters) if m > 0]
        if clustering is not None and all(c is not None for c in owned):
            why = ('reducers gives every stage with clusters its own reducer, '
                   'so no block builds the soft clustering network')
            if clustering != self.default_clustering:
                raise ValueError(f'clustering={clustering!r} is not used: '
                                 f'{why}; leave clustering out (or None)')
            warn_unused('clustering', clustering, why)
        if clustering_interval and all(c is not None and not c.shareable
                                       for c in owned):
            warn_unused('clustering_interval', clustering_interval,
                        'no reducer of this model can share its assignment, '
                        'so every block clusters on its own')

    def _parse_reducers(self, reducers, clustering: str,
                        num_clusters: Sequence[int]) -> List[Optional[Dict]]:
        """One reducer config (None: none of its own) per stage."""
        if reducers is None:
            if clustering == 'teacher':
                return [None] * self.num_stages
            reducers = dict(type='SoftCluster', net=clustering)
        elif clustering == 'teacher':
            raise ValueError("reducers does not apply to clustering="
                             "'teacher' (the teacher assigns for every block)")
        parsed = per_stage_reducers(reducers, [m > 0 for m in num_clusters])
        for i, (r, m) in enumerate(zip(parsed, num_clusters)):
            if r is not None and m == 0:
                raise ValueError(f'reducers[{i}] is set but stage {i} has 0 '
                                 'clusters (full attention)')
        return parsed

    @classmethod
    def arch_settings(cls, arch: Union[str, Dict],
                      clustering: str = 'conv') -> Dict:
        """The checked settings of ``arch`` (a zoo name or a dict) for
        ``clustering``: per-stage tuples of ``embed_dims``, ``num_heads``,
        ``depths``, ``mlp_ratios`` (and ``teacher_depths`` for 'teacher')."""
        zoo, required = cls.arch_zoo, ['embed_dims', 'num_heads', 'depths']
        teacher = ['teacher_depths']  # required by, and checked for, teacher
        if clustering == 'teacher':
            zoo = {name: dict(settings, **cls.teacher_arch_zoo[name])
                   for name, settings in zoo.items()}
            required, teacher = required + teacher, []
        return parse_arch(arch, zoo, required,
                          dict(mlp_ratios=(4, ) * cls.num_stages),
                          cls.num_stages, optional=teacher)

    def forward_stem(self, images: torch.Tensor
                     ) -> Tuple[torch.Tensor, List[tuple]]:
        """The stem's map and, with the teacher, each stage's assignment and
        the teacher's stage features (added before the stage's norm)."""
        tokens, hw = self.stem(images)
        x = tokens_to_map(tokens, hw)
        if self.teacher is None:
            return x, [()] * self.num_stages
        # one view per path: their gradients are summed on the tokens, in
        # token layout (the stem's gradients do not depend on the teacher
        # path's memory format)
        assignments, features = self.teacher(tokens_to_map(tokens, hw))
        return x, list(zip(assignments, features))

    def _frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        frozen = [self.stem] + list(self.stages[:self.frozen_stages])
        if self.teacher is not None and self.frozen_stages > 0:
            frozen.append(self.teacher)
        return frozen

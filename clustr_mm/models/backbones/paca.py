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
from .base import PyramidBackbone, parse_arch, per_stage_reducers
from .inputs import check_images
from ..layers import ConvFFN, DropPath, tokens_to_map
from ..layers.cluster_attention import PaCaAttention
from ..layers.reducers import assignment_map, reducer_class

Tokens = Tuple[torch.Tensor, Tuple[int, int]]


def _map_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, C); a view when ``x`` is channels-last."""
    return x.flatten(2).transpose(1, 2)


class PaCaStem(nn.Module):
    """Two 3x3 stride-2 convs (3 -> C/2 -> C, nothing between) + LayerNorm."""

    def __init__(self, in_channels: int, dim: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, dim // 2, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(dim // 2, dim, 3, stride=2, padding=1)
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> Tokens:
        # channels-last convs are 2-3x faster on CPU and their output is
        # already in token order
        x = x.contiguous(memory_format=torch.channels_last)
        x = self.conv2(self.conv1(x))
        return self.norm(_map_to_tokens(x)), tuple(x.shape[2:])


class PaCaDownsample(nn.Module):
    """Transition between stages: 3x3 stride-2 conv + LayerNorm."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, 3, stride=2, padding=1)
        self.norm = nn.LayerNorm(out_dim, eps=1e-6)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> Tokens:
        x = self.conv(tokens_to_map(x, hw))
        return self.norm(_map_to_tokens(x)), tuple(x.shape[2:])


class PaCaBlock(nn.Module):
    """x + DropPath(PaCa(LN(x))), then x + DropPath(ConvFFN(LN(x))).

    ``reducer``, ``compact_qv`` and ``reducer_context`` go to
    :class:`PaCaAttention`.
    """

    def __init__(self, dim: int, num_heads: int, num_clusters: int,
                 clustering: Optional[str], mlp_ratio: int, drop_path: float,
                 reducer: Optional[dict] = None, compact_qv: bool = False,
                 reducer_context: Optional[dict] = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = PaCaAttention(
            dim, num_heads, num_clusters, clustering, mlp_ratio=mlp_ratio,
            reducer=reducer, compact_qv=compact_qv,
            reducer_context=reducer_context)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.ffn = ConvFFN(dim, dim * mlp_ratio)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int],
                assignment: Optional[torch.Tensor]):
        out, assignment = self.attn(self.norm1(x), hw, assignment)
        x = x + self.drop_path(out)
        x = x + self.drop_path(self.ffn(self.norm2(x), hw))
        return x, assignment


class PaCaStage(nn.Module):
    """Optional downsample, a run of blocks, and the stage's LayerNorm.

    The norm sits on the main path (the next stage starts from it), so every
    stage has one whether or not its output is returned.
    """

    def __init__(self, downsample: Optional[nn.Module],
                 blocks: List[PaCaBlock], dim: int):
        super().__init__()
        self.downsample = downsample
        self.blocks = nn.ModuleList(blocks)
        self.norm = nn.LayerNorm(dim, eps=1e-6)


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
        clustering (str): How cluster assignments are computed: 'conv'
            (depthwise 7x7 conv net, default), 'mlp' (per-token MLP) or
            'teacher' (ConvMixer + FPN network for all stages).
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
        keep_assignments (bool): Opt-in for visualisation: when True (may also
            be set on the instance later), every forward stores
            ``self.assignments``, one list per stage holding each distinct
            assignment map used in it as a detached (B, M, H, W) tensor
            (soft) or (B, H, W) cluster ids (hard: DPCKNN, GridPool,
            CentroidAttention reducers), empty for full-attention stages.
            Off by default, so the normal path keeps nothing.
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
        init_cfg (dict | list, optional): mmengine init config. A
            ``Pretrained`` entry (optionally with ``prefix``) is loaded with
            :func:`clustr_mm.checkpoints.load_backbone_state`, which
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
    num_stages = 4
    # offered to reducers that size their summary by a reduction ratio
    default_sr_ratios = (8, 4, 2, 1)

    def __init__(self,
                 arch: Union[str, Dict] = 'small',
                 clustering: str = 'conv',
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
                 init_cfg: Optional[Union[Dict, List[Dict]]] = None):
        super().__init__(init_cfg=init_cfg)
        if clustering not in self.clusterings:
            raise ValueError(f'clustering must be one of {self.clusterings}, '
                             f'got {clustering!r}')
        arch = self._resolve_arch(arch, clustering)
        embed_dims, num_heads, depths = (arch['embed_dims'], arch['num_heads'],
                                         arch['depths'])
        mlp_ratios = arch['mlp_ratios']
        if num_clusters is None:
            num_clusters = (100, ) * 4 if clustering == 'teacher' else (
                100, 100, 100, 0)
        num_clusters = tuple(num_clusters)
        if (len(num_clusters) != self.num_stages
                or any(not isinstance(m, int) or m < 0
                       for m in num_clusters)):
            raise ValueError('num_clusters must be 4 non-negative ints, got '
                             f'{num_clusters}')
        if not isinstance(clustering_interval, int) or clustering_interval < 0:
            raise ValueError('clustering_interval must be an int >= 0, got '
                             f'{clustering_interval!r}')
        if clustering == 'teacher' and clustering_interval:
            raise ValueError('clustering_interval does not apply to '
                             "clustering='teacher' (the teacher assigns for "
                             'every block)')
        self._set_stage_options(self.num_stages, out_indices, frozen_stages,
                                norm_eval, drop_path_rate)

        self.arch = arch
        self.clustering = clustering
        self.num_clusters = num_clusters
        self.in_channels = in_channels
        self.embed_dims = embed_dims
        self.keep_assignments = keep_assignments
        self.assignments: List[List[torch.Tensor]] = []

        self.stem = PaCaStem(in_channels, embed_dims[0])
        self.teacher = None
        if clustering == 'teacher':
            self.teacher = ConvMixerTeacher(embed_dims, arch['teacher_depths'],
                                            num_clusters)

        self.reducers = self._parse_reducers(reducers, clustering,
                                             num_clusters)
        self.compact_qv = compact_qv
        rates = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        self.stages = nn.ModuleList()
        for i in range(self.num_stages):
            reducer = self.reducers[i]
            cls = reducer_class(reducer)
            blocks = []
            for j in range(depths[i]):
                if clustering == 'teacher':
                    own = False
                elif cls is not None and not cls.shareable:
                    own = True
                elif clustering_interval == 0:
                    own = j == 0
                else:
                    own = j % clustering_interval == 0
                blocks.append(
                    PaCaBlock(embed_dims[i], num_heads[i], num_clusters[i],
                              clustering if own else None, mlp_ratios[i],
                              rates[sum(depths[:i]) + j],
                              reducer=reducer if own else None,
                              compact_qv=compact_qv,
                              reducer_context=dict(
                                  sr_ratio=self.default_sr_ratios[i])))
            downsample = (PaCaDownsample(embed_dims[i - 1], embed_dims[i])
                          if i > 0 else None)
            self.stages.append(PaCaStage(downsample, blocks, embed_dims[i]))
        self.train(self.training)  # frozen_stages and norm_eval from the start

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
    def _resolve_arch(cls, arch: Union[str, Dict], clustering: str) -> Dict:
        zoo, required = cls.arch_zoo, ['embed_dims', 'num_heads', 'depths']
        teacher = ['teacher_depths']  # required by, and checked for, teacher
        if clustering == 'teacher':
            zoo = {name: dict(settings, **cls.teacher_arch_zoo[name])
                   for name, settings in zoo.items()}
            required, teacher = required + teacher, []
        return parse_arch(arch, zoo, required,
                          dict(mlp_ratios=(4, ) * cls.num_stages),
                          cls.num_stages, optional=teacher)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        check_images(x, self.in_channels, 'PaCaViT')
        x, hw = self.stem(x)
        teacher_assign, teacher_feats = [None] * self.num_stages, None
        if self.teacher is not None:
            teacher_assign, teacher_feats = self.teacher(tokens_to_map(x, hw))
        keep = self.keep_assignments
        if keep:
            self.assignments = []
        outs = []
        for i, stage in enumerate(self.stages):
            if stage.downsample is not None:
                x, hw = stage.downsample(x, hw)
            assignment = teacher_assign[i]
            kept = []
            if keep and assignment is not None:
                kept.append(assignment)
            for block in stage.blocks:
                x, assignment = block(x, hw, assignment)
                if keep and block.attn.clustering is not None:
                    kept.append(assignment)
            if teacher_feats is not None:
                x = x + _map_to_tokens(teacher_feats[i])
            x = stage.norm(x)
            if keep:
                self.assignments.append(
                    [assignment_map(a, hw) for a in kept])
            if i in self.out_indices:
                # contiguous NCHW: necks and heads may call .view() on it
                outs.append(tokens_to_map(x, hw).contiguous())
        return tuple(outs)

    def _frozen_modules(self) -> List[nn.Module]:
        if self.frozen_stages < 0:
            return []
        frozen = [self.stem] + list(self.stages[:self.frozen_stages])
        if self.teacher is not None and self.frozen_stages > 0:
            frozen.append(self.teacher)
        return frozen

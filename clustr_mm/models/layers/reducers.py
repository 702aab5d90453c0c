"""Token reducers: N patch tokens -> a few summary tokens for keys/values.

ClusTR, PaCa-ViT, PVT and Centroid Transformers all attend from every token
to a smaller set of *summary* tokens; they differ only in how the summary is
formed. Each way is a registered :class:`~.token_reducer.TokenReducer`
(the interface is in :mod:`~.token_reducer`); ClusTR's is
:class:`~.dpc_knn.DPCKNN`, the others are here.

Reducers (all in MMEngine's root ``MODELS``, so a config names them by type):

=====================  ========================================================
``DPCKNN``             ClusTR: DPC-kNN density-peaks clustering, w-weighted
                       merge; exact (per image) or windowed; several nested
                       scales. No parameters.
``SoftCluster``        PaCa-ViT: a conv or MLP net scores tokens for M
                       clusters, softmax over the tokens, ``Z = A X``.
``CentroidAttention``  Centroid Transformers: centroids from pooling / a
                       strided depthwise conv, then T attention updates,
                       optionally restricted to each centroid's kNN.
``GridPool``           PVT's spatial reduction: strided conv + LayerNorm.
``AvgGridPool``        Cell means, no parameters (TCFormer's pose neck).
=====================  ========================================================

:class:`~.cluster_attention.SummaryAttention` turns any of them into
attention; backbones choose one per stage from their config, filling in the
stage's ``dim``, ``sr_ratio``, ``num_heads``... (see
:func:`~.token_reducer.build_reducer`).
"""
import math
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.dpc_knn.dispatch import plan_for
from ...ops.dpc_knn.reference import augment
from ...registry import register_model
from .arg_checks import (check_bool, check_hidden_width, check_int,
                         check_number, check_optional_int)
from .attention import split_heads
from .patch_embed import tokens_to_map
from .token_reducer import Grid, Reduction, TokenReducer, apply_assignment


def _pad_to_multiple(grid: torch.Tensor, stride: int) -> torch.Tensor:
    """Zero-pad (B, C, H, W) at the bottom/right to multiples of ``stride``."""
    ph, pw = -grid.shape[2] % stride, -grid.shape[3] % stride
    return F.pad(grid, (0, pw, 0, ph)) if ph or pw else grid


def _cell_ids(hw: Grid, stride: int, device) -> torch.Tensor:
    """(N,) id of the stride x stride cell (row-major) holding each token."""
    h, w = hw
    cols = -(-w // stride)
    rows = torch.arange(h, device=device) // stride
    return (rows[:, None] * cols +
            torch.arange(w, device=device)[None] // stride).reshape(-1)


def _grid_shape(m: int) -> Grid:
    """Most square (rows, cols) with rows * cols == m, rows <= cols."""
    rows = max(d for d in range(1, math.isqrt(m) + 1) if m % d == 0)
    return rows, m // rows


# ---------------------------------------------------------------------------
class PointwiseConv(nn.Linear):
    """A 1x1 convolution applied to (B, N, C) tokens.

    Same maths as ``nn.Conv2d(in, out, 1)`` without an NCHW round trip; its
    weight is (out, in) instead of (out, in, 1, 1). A separate type so that
    weight init can treat it as the convolution it stands for.
    """


def soft_assignment(logits: torch.Tensor) -> torch.Tensor:
    """(B, N, M) logits -> (B, M, N) assignment, softmax over the N tokens."""
    return logits.transpose(1, 2).softmax(dim=-1)


@register_model
class SoftCluster(TokenReducer):
    """PaCa-ViT's learned soft clustering: ``Z = softmax_N(logits)^T X``.

    Clustering logits (B, N, M) come from a small network, soft-maxed over
    the N tokens, so each of the M summary tokens is a convex combination of
    all tokens (cost linear in N). Given token ``weights`` the combination is
    additionally weighted by them (``log w`` added to the logits).

    ``net='conv'`` (the paper's default): depthwise kxk conv (bias) -> GELU
    -> 1x1 conv C->C -> GELU -> 1x1 conv C->M (no bias). ``net='mlp'``:
    Linear C->rC -> GELU -> Linear rC->M (both with bias). The layers are
    direct children (``dwconv``, ``pwconv``, ``to_clusters`` / ``fc1``,
    ``fc2``), as in the released checkpoints.

    Args:
        dim (int): Token channels C.
        num_clusters (int): M.
        net (str): 'conv' or 'mlp'. Default 'conv'.
        kernel_size (int): Depthwise kernel of the conv net. Default 7.
        mlp_ratio (float): Hidden ratio of the mlp net (``int(dim *
            mlp_ratio)`` channels, at least 1). Default 4.
    """
    shareable = True
    nets = ('conv', 'mlp')

    def __init__(self, dim: int, num_clusters: int, net: str = 'conv',
                 kernel_size: int = 7, mlp_ratio: int = 4):
        super().__init__()
        check_int('dim', dim, 1)
        check_int('num_clusters', num_clusters, 1)
        if net not in self.nets:
            raise ValueError(f'net must be one of {self.nets}, got {net!r}')
        check_int('kernel_size', kernel_size, 1)
        if kernel_size % 2 == 0:
            raise ValueError(f'kernel_size must be odd (the map keeps its '
                             f'size with padding k // 2), got {kernel_size}')
        hidden = check_hidden_width('mlp_ratio', dim, mlp_ratio)
        self.net = net
        self.num_clusters = num_clusters
        if net == 'conv':
            self.dwconv = nn.Conv2d(dim, dim, kernel_size,
                                    padding=kernel_size // 2, groups=dim)
            self.pwconv = PointwiseConv(dim, dim)
            self.to_clusters = PointwiseConv(dim, num_clusters, bias=False)
        else:
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, num_clusters)
        self.act = nn.GELU()

    def num_tokens(self, hw: Grid) -> List[int]:
        return [self.num_clusters]

    def logits(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        """(B, N, C) tokens -> (B, N, M) clustering logits."""
        if self.net == 'mlp':
            return self.fc2(self.act(self.fc1(x)))
        # channels-last view, no copy (see ConvFFN for why not transpose)
        h = self.act(self.dwconv(tokens_to_map(x, hw)))
        return self.to_clusters(self.act(self.pwconv(
            h.flatten(2).transpose(1, 2))))

    def forward(self, x: torch.Tensor, hw: Grid,
                weights: Optional[torch.Tensor] = None) -> Reduction:
        logits = self.logits(x, hw)
        if weights is not None:
            logits = logits + weights.log()
        assignment = soft_assignment(logits)
        return Reduction([apply_assignment(assignment, x)], [assignment])

    def extra_repr(self) -> str:
        return f'net={self.net}, num_clusters={self.num_clusters}'


# ---------------------------------------------------------------------------
@register_model
class GridPool(TokenReducer):
    """PVT's spatial-reduction summary: Conv(kernel = stride = r) + LayerNorm.

    Each summary token covers an r x r cell of the grid. Grids that are not
    multiples of r are zero-padded at the bottom/right (so every token is
    covered and tiny grids still give one cell); PVT crops instead, which is
    the same whenever r divides the grid (e.g. every stage at 224x224).

    Args:
        dim (int): Channels.
        sr_ratio (int): Cell side r.
        norm_eps (float): LayerNorm epsilon. Default 1e-5 (PVT).
    """

    def __init__(self, dim: int, sr_ratio: int, norm_eps: float = 1e-5):
        super().__init__()
        check_int('dim', dim, 1)
        check_int('sr_ratio', sr_ratio, 1)
        check_number('norm_eps', norm_eps, 0, low_open=True)
        self.sr_ratio = sr_ratio
        self.sr = nn.Conv2d(dim, dim, sr_ratio, stride=sr_ratio)
        self.norm = nn.LayerNorm(dim, eps=norm_eps)
        self._ids = None  # (key, ids) of the last grid

    def num_tokens(self, hw: Grid) -> List[int]:
        return [-(-hw[0] // self.sr_ratio) * -(-hw[1] // self.sr_ratio)]

    def cell_ids(self, hw: Grid, device) -> torch.Tensor:
        key = (tuple(hw), device)
        if self._ids is None or self._ids[0] != key:
            self._ids = (key, _cell_ids(hw, self.sr_ratio, device))
        return self._ids[1]

    def forward(self, x: torch.Tensor, hw: Grid,
                weights: Optional[torch.Tensor] = None) -> Reduction:
        grid = _pad_to_multiple(tokens_to_map(x, hw), self.sr_ratio)
        z = self.norm(self.sr(grid).flatten(2).transpose(1, 2))
        ids = [self.cell_ids(hw, x.device).expand(x.shape[0], -1)]
        return Reduction([z], ids)

    def extra_repr(self) -> str:
        return f'sr_ratio={self.sr_ratio}'


# ---------------------------------------------------------------------------
@register_model
class AvgGridPool(TokenReducer):
    """The mean of each r x r cell of the grid: no parameters, no norm.

    The keys/values of TCFormer's pose neck (MTA) and PVTv2-li: pooled
    tokens straight into the key/value projection. A grid that is not a
    multiple of r gets smaller last cells (the mean of the tokens they hold,
    ``ceil_mode``), so every token is covered; where r divides the grid (every
    level at 256x192) this is plain ``AvgPool2d(r, r)``.

    Args:
        sr_ratio (int): Cell side r.
    """

    def __init__(self, sr_ratio: int):
        super().__init__()
        if isinstance(sr_ratio, bool) or not isinstance(
                sr_ratio, int) or sr_ratio < 1:
            raise ValueError(f'sr_ratio must be a positive int, got '
                             f'{sr_ratio!r}')
        self.sr_ratio = sr_ratio

    def num_tokens(self, hw: Grid) -> List[int]:
        return [-(-hw[0] // self.sr_ratio) * -(-hw[1] // self.sr_ratio)]

    def forward(self, x: torch.Tensor, hw: Grid,
                weights: Optional[torch.Tensor] = None) -> Reduction:
        r = self.sr_ratio
        # no padding: a clipped last cell is divided by its own token count
        z = F.avg_pool2d(tokens_to_map(x, hw), r, r, ceil_mode=True)
        z = z.flatten(2).transpose(1, 2)
        ids = [_cell_ids(hw, r, x.device).expand(x.shape[0], -1)]
        return Reduction([z], ids)

    def extra_repr(self) -> str:
        return f'sr_ratio={self.sr_ratio}'


# ---------------------------------------------------------------------------
@register_model
class CentroidAttention(TokenReducer):
    """Centroid attention ("Centroid Transformers", Wu et al. 2021).

    Centroids ``u`` are initialised from the token grid, then refined by
    ``iters`` = T attention steps over the tokens ``x``::

        u_j <- u_j + (1/T) sum_i s_ij v(x_i)
        s_ij = softmax(q(u_j) . k(x_i) / sqrt(d))

    per head, where the softmax runs over the centroids j (``normalize=
    'centroids'``, the paper's clustering-derived form: every token hands out
    a unit of mass) or over the tokens i (``'inputs'``: standard attention,
    every centroid takes a convex combination). With M = N, identity init
    (``sr_ratio=1``, pooling) and T = 1 a step is self-attention plus the
    skip connection.

    Initialisation: ``init='pool'`` averages r x r cells (``sr_ratio``) or,
    with ``num_clusters`` M, adaptively pools the grid to the most square
    M-cell layout; ``init='conv'`` is a depthwise conv with kernel = stride
    = r (needs ``sr_ratio``). Grids that are not multiples of r are padded
    (pooling averages only real tokens).

    ``knn=k`` restricts each centroid to its k nearest tokens (Euclidean, in
    feature space, from the initial centroids; found without gradient in
    bounded chunks); attention then costs O(M k) instead of O(M N). Tokens
    no centroid picked get no mass.

    Assignment (visualisation): hard ids (B, N), the centroid that receives
    most of each token in the last step (head-averaged); -1 for tokens
    outside every kNN set.

    Args:
        dim (int): Channels.
        sr_ratio (int, optional): Cell side of the initialisation.
        num_clusters (int, optional): Fixed number of centroids (pool init);
            takes precedence over ``sr_ratio``.
        num_heads (int): Heads of the update. Default 1.
        iters (int): Update steps T. Default 1.
        init (str): 'pool' or 'conv'. Default 'pool'.
        knn (int, optional): Neighbours per centroid; None attends to all.
        normalize (str): 'centroids' (paper) or 'inputs'. Default
            'centroids'.
        qkv_bias (bool): Bias of q, k, v. Default True. One of them
            cancels in the softmax, as k's does in standard attention, and
            never gets a gradient: with 'centroids' q's (b.k(x_i) is the
            same for every centroid of token i), with 'inputs' k's
            (q(u_j).b is the same for every token of centroid j).
    """
    inits = ('pool', 'conv')
    normalizations = ('centroids', 'inputs')

    def __init__(self, dim: int, sr_ratio: Optional[int] = None,
                 num_clusters: Optional[int] = None, num_heads: int = 1,
                 iters: int = 1, init: str = 'pool',
                 knn: Optional[int] = None, normalize: str = 'centroids',
                 qkv_bias: bool = True):
        super().__init__()
        if init not in self.inits:
            raise ValueError(f'init must be one of {self.inits}, got {init!r}')
        if normalize not in self.normalizations:
            raise ValueError(f'normalize must be one of '
                             f'{self.normalizations}, got {normalize!r}')
        if num_clusters is not None and init == 'pool':
            sr_ratio = None
        if sr_ratio is None and (num_clusters is None or init == 'conv'):
            raise ValueError('CentroidAttention needs sr_ratio (or '
                             'num_clusters with init="pool")')
        for name, value in (('sr_ratio', sr_ratio),
                            ('num_clusters', num_clusters), ('knn', knn)):
            check_optional_int(name, value, 1)
        check_int('iters', iters, 1)
        check_int('num_heads', num_heads, 1)
        check_bool('qkv_bias', qkv_bias)
        if dim % num_heads:
            raise ValueError(f'dim {dim} is not divisible by num_heads '
                             f'{num_heads}')
        self.sr_ratio = sr_ratio
        self.num_clusters = num_clusters if sr_ratio is None else None
        self.num_heads = num_heads
        self.iters = iters
        self.init = init
        self.knn = knn
        self.normalize = normalize
        self.scale = (dim // num_heads)**-0.5
        if init == 'conv':
            self.init_conv = nn.Conv2d(dim, dim, sr_ratio, stride=sr_ratio,
                                       groups=dim)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.k = nn.Linear(dim, dim, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)

    def num_tokens(self, hw: Grid) -> List[int]:
        if self.sr_ratio is None:
            return [self.num_clusters]
        return [-(-hw[0] // self.sr_ratio) * -(-hw[1] // self.sr_ratio)]

    def initial_centroids(self, x: torch.Tensor, hw: Grid) -> torch.Tensor:
        """(B, N, C) -> (B, M, C) centroids before the updates."""
        if self.sr_ratio is None:
            grid = F.adaptive_avg_pool2d(tokens_to_map(x, hw),
                                         _grid_shape(self.num_clusters))
        elif self.init == 'conv':
            grid = self.init_conv(
                _pad_to_multiple(tokens_to_map(x, hw), self.sr_ratio))
        elif self.sr_ratio == 1:
            return x
        else:
            grid = F.avg_pool2d(tokens_to_map(x, hw), self.sr_ratio,
                                ceil_mode=True)
        return grid.flatten(2).transpose(1, 2)

    @torch.no_grad()
    def neighbours(self, u: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """(B, M, knn) indices of each centroid's nearest tokens."""
        b, m, c = u.shape
        n = x.shape[1]
        k = min(self.knn, n)
        with torch.autocast(x.device.type, enabled=False):
            rows, cols = augment(u.float())[0], augment(x.float())[1]
            step = max(1, plan_for(x.device).max_chunk_elems // (b * n))
            return torch.cat([
                torch.bmm(rows[:, r:r + step], cols).topk(
                    k, dim=-1, largest=False).indices
                for r in range(0, m, step)
            ], 1)

    def _dense_step(self, q, k, v):
        """One update from all tokens; q (B,h,M,d), k/v (B,h,N,d)."""
        p = (q @ k.transpose(-2, -1) * self.scale).softmax(
            dim=-2 if self.normalize == 'centroids' else -1)
        return p @ v, p.mean(1)  # (B,h,M,d), head-mean (B,M,N)

    def _knn_step(self, q, k, v, idx):
        """One update from each centroid's kNN tokens; idx (B, M, K)."""
        b, h, m, d = q.shape
        n, kk = k.shape[2], idx.shape[2]
        flat = idx.reshape(b, 1, m * kk, 1).expand(b, h, m * kk, d)
        kg = k.gather(2, flat).view(b, h, m, kk, d)
        vg = v.gather(2, flat).view(b, h, m, kk, d)
        logits = torch.einsum('bhmd,bhmkd->bhmk', q, kg) * self.scale
        if self.normalize == 'inputs':
            p = logits.softmax(-1)
        else:  # softmax over the centroids that picked each token
            tok = idx.reshape(b, 1, m * kk).expand(b, h, m * kk)
            flat_logits = logits.reshape(b, h, m * kk)
            peak = flat_logits.new_full((b, h, n), float('-inf'))
            peak = peak.scatter_reduce(2, tok, flat_logits.detach(), 'amax')
            e = (flat_logits - peak.gather(2, tok)).exp()
            total = e.new_zeros(b, h, n).scatter_add(2, tok, e)
            p = (e / total.gather(2, tok)).view(b, h, m, kk)
        return torch.einsum('bhmk,bhmkd->bhmd', p, vg), p.mean(1)

    def _hard_ids(self, p: torch.Tensor, idx: Optional[torch.Tensor],
                  n: int) -> torch.Tensor:
        """(B, N) centroid receiving most of each token (-1: none)."""
        if idx is None:
            return p.argmax(1)
        b, m, kk = p.shape
        tok = idx.reshape(b, m * kk)
        flat = p.reshape(b, m * kk)
        best = flat.new_full((b, n), -1.0).scatter_reduce(1, tok, flat,
                                                          'amax')
        who = torch.arange(m, device=p.device).repeat_interleave(kk)
        who = torch.where(flat == best.gather(1, tok), who.expand(b, -1), m)
        ids = torch.full((b, n), m, dtype=torch.long,
                         device=p.device).scatter_reduce(1, tok, who, 'amin')
        return ids.masked_fill_(ids == m, -1)

    def forward(self, x: torch.Tensor, hw: Grid,
                weights: Optional[torch.Tensor] = None) -> Reduction:
        u = self.initial_centroids(x, hw)
        idx = self.neighbours(u, x) if self.knn else None
        k = split_heads(self.k(x), self.num_heads)
        v = split_heads(self.v(x), self.num_heads)
        b, m, c = u.shape
        for _ in range(self.iters):
            q = split_heads(self.q(u), self.num_heads)
            if idx is None:
                upd, p = self._dense_step(q, k, v)
            else:
                upd, p = self._knn_step(q, k, v, idx)
            u = u + upd.transpose(1, 2).reshape(b, m, c) / self.iters
        ids = [self._hard_ids(p.detach(), idx, x.shape[1])]
        return Reduction([u], ids)

    def extra_repr(self) -> str:
        size = (f'sr_ratio={self.sr_ratio}' if self.sr_ratio else
                f'num_clusters={self.num_clusters}')
        return (f'{size}, init={self.init}, iters={self.iters}, '
                f'heads={self.num_heads}, knn={self.knn}, '
                f'normalize={self.normalize}')

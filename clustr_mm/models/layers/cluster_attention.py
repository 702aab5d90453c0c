"""One attention for every reducer: queries from the N tokens, keys/values
from the summary tokens a :class:`~.token_reducer.TokenReducer` makes of
them.

``SummaryAttention`` is the machinery; ClusTR's ``ClusterAttention`` and
PaCa-ViT's ``PaCaAttention`` are named settings of it (parameter names and
maths of the released models).
"""
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import nn

from ...ops.dpc_knn.common import CLUSTR_SCALES
from .arg_checks import check_bool, check_number
from .attention import multi_head_attention
from .token_reducer import TokenReducer, apply_assignment, build_reducer

Grid = Tuple[int, int]
ReducerCfg = Union[dict, TokenReducer, None]


class SummaryAttention(nn.Module):
    """Multi-head attention from N tokens to per-scale summary tokens.

    For each scale s of the reducer's output (or the tokens themselves when
    there is no reducer: full self-attention), ``softmax(q k_s^T / sqrt(d))
    v_s`` with q from the tokens and k_s, v_s projected from the summary
    tokens; the scales' outputs are summed and projected (``proj``).

    Parameter names: ``q``, ``weight_layer`` (learned token weights
    ``exp(weight_layer(x))`` for reducers that merge tokens; in fp32 for a
    reducer that computes in fp32, see ``TokenReducer.fp32``), then per scale
    either ``kv`` (``kv_layout='fused'``, one C->2C linear) or ``k`` and
    ``v`` (``'split'``), or only ``k`` with ``compact_qv``; ``proj``;
    ``cluster_norm`` (``summary_norm``, a LayerNorm on the summary tokens);
    ``clustering`` (the reducer). With several scales the per-scale names get
    a 1-based suffix (``kv1``, ``kv2``).

    Compact Q/V (Armour): with ``compact_qv=True`` the values are made by the
    query projection, ``v_s = q(summary_s)`` (queries from the tokens, values
    from the summary tokens, one shared weight), saving C*C + C parameters per
    scale.

    Args:
        dim (int): Channels C.
        num_heads (int): Heads; must divide ``dim``.
        reducer (dict | TokenReducer | None): The summary maker (built with
            :func:`build_reducer`, given ``dim``, ``num_heads`` and
            ``reducer_context``), or None for full self-attention, or for an
            external assignment with ``shared=True``.
        shared (bool): No own reducer: the summary is an assignment handed to
            :meth:`forward` (PaCa's later blocks of a stage, or its teacher)
            applied to this layer's tokens. Default False.
        qkv_bias (bool): Bias of the q/k/v projections. Default True.
        kv_layout (str): 'fused' (``kv``) or 'split' (``k``, ``v``).
        summary_norm (bool): LayerNorm (eps 1e-6) on the summary tokens.
        token_weights (bool, optional): Create ``weight_layer`` and pass the
            weights to the reducer; None: if the reducer uses them.
        compact_qv (bool): Values from the query projection. Default False.
        proj_drop (float): Dropout after ``proj``. Default 0.
        reducer_context (dict, optional): Stage settings offered to the
            reducer's constructor (e.g. ``sr_ratio``, ``window_size``).
    """
    kv_layouts = ('fused', 'split')
    # How analysis.flops sorts the work of a module (the first marked one
    # up its path): 'attention' is its projections, except the attention
    # products (matmul, bmm, sdpa...) it runs itself and, listed in
    # clustering_ops, the ops that make summary tokens (a shared layer's
    # assignment @ tokens); the token weights and summary norms are marked
    # 'clustering' below.
    flop_kind = 'attention'
    clustering_ops: Tuple[str, ...] = ()

    def __init__(self,
                 dim: int,
                 num_heads: int,
                 reducer: ReducerCfg = None,
                 *,
                 shared: bool = False,
                 qkv_bias: bool = True,
                 kv_layout: str = 'fused',
                 summary_norm: bool = False,
                 token_weights: Optional[bool] = None,
                 compact_qv: bool = False,
                 proj_drop: float = 0.0,
                 reducer_context: Optional[dict] = None):
        super().__init__()
        for name, value in (('shared', shared), ('qkv_bias', qkv_bias),
                            ('summary_norm', summary_norm),
                            ('compact_qv', compact_qv)):
            check_bool(name, value)
        if token_weights is not None:
            check_bool('token_weights', token_weights)
        check_number('proj_drop', proj_drop, 0, 1)
        if dim % num_heads:
            raise ValueError(
                f'dim {dim} is not divisible by num_heads {num_heads}')
        if kv_layout not in self.kv_layouts:
            raise ValueError(f'kv_layout must be one of {self.kv_layouts}, '
                             f'got {kv_layout!r}')
        if shared and reducer is not None:
            raise ValueError('a shared layer applies an external assignment '
                             'and cannot own a reducer')
        self.num_heads = num_heads
        self.shared = shared
        self.compact_qv = compact_qv
        clustering = None
        if reducer is not None:
            clustering = build_reducer(reducer, dim=dim, num_heads=num_heads,
                                       **(reducer_context or {}))
        num_scales = clustering.num_scales if clustering is not None else 1
        if token_weights is None:
            token_weights = bool(clustering is not None
                                 and clustering.uses_token_weights)

        # Registration order = state-dict order of the released models.
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.weight_layer = nn.Linear(dim, 1) if token_weights else None
        if token_weights:
            self.weight_layer.flop_kind = 'clustering'
        self._k_names, self._v_names, self._norm_names = [], [], []
        for s in range(num_scales):
            suffix = str(s + 1) if num_scales > 1 else ''
            if compact_qv:
                self._add(f'k{suffix}', nn.Linear(dim, dim, bias=qkv_bias),
                          self._k_names)
                self._v_names.append(None)
            elif kv_layout == 'fused':
                self._add(f'kv{suffix}',
                          nn.Linear(dim, 2 * dim, bias=qkv_bias),
                          self._k_names)
                self._v_names.append(None)
            else:
                self._add(f'k{suffix}', nn.Linear(dim, dim, bias=qkv_bias),
                          self._k_names)
                self._add(f'v{suffix}', nn.Linear(dim, dim, bias=qkv_bias),
                          self._v_names)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        has_summary = clustering is not None or shared
        for s in range(num_scales):
            suffix = str(s + 1) if num_scales > 1 else ''
            if summary_norm and has_summary:
                norm = nn.LayerNorm(dim, eps=1e-6)
                norm.flop_kind = 'clustering'
                self._add(f'cluster_norm{suffix}', norm, self._norm_names)
            else:
                self._norm_names.append(None)
        self.clustering = clustering
        if shared:
            self.clustering_ops = ('bmm', )  # apply_assignment
        self.fused = kv_layout == 'fused' and not compact_qv

    def _add(self, name: str, module: nn.Module, names: list) -> None:
        self.add_module(name, module)
        names.append(name)

    def _key_value(self, s: int, z: torch.Tensor, q: torch.Tensor,
                   x: torch.Tensor):
        key = getattr(self, self._k_names[s])
        if self.fused:
            return key(z).chunk(2, -1)
        if self.compact_qv:
            # queries of the tokens are the values of full attention
            return key(z), q if z is x else self.q(z)
        return key(z), getattr(self, self._v_names[s])(z)

    def forward(self, x: torch.Tensor, hw: Grid,
                assignment: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """x: (B, N, C) tokens of the ``hw`` grid (every attention of the
        package is called so).

        Args:
            assignment: (B, M, N) soft assignment, required by shared layers
                (ignored otherwise).

        Returns:
            (B, N, C) output and the per-scale assignments behind the keys
            and values (empty for full attention).
        """
        q = self.q(x)
        if self.clustering is not None:
            tokens, w = x, None
            # the weights' logs, for a reducer that takes them (its op then
            # runs the exp), else the weights
            log = self.clustering.takes_log_weights
            if self.clustering.fp32:
                # One cast for the reducer and the token weights: no cast
                # of them under autocast, and exp of an fp32 logit (from
                # the layer's weights in fp32 too, whatever the model's
                # dtype: .half() / .bfloat16() / .double()).
                tokens = x.float()
                layer = self.weight_layer
                if layer is not None:
                    with torch.autocast(x.device.type, enabled=False):
                        if layer.weight.dtype == torch.float32:
                            w = layer(tokens)
                        else:
                            w = F.linear(tokens, layer.weight.float(),
                                         layer.bias.float())
            elif self.weight_layer is not None:
                w = self.weight_layer(x)
            # keywords: hooks (e.g. the FLOP counter's) read x, hw by name
            if w is not None and log:
                summaries, assignments = self.clustering(tokens, hw=hw,
                                                         log_weights=w)
            else:
                summaries, assignments = self.clustering(
                    tokens, hw=hw, weights=None if w is None else w.exp())
            if tokens is not x:
                # back to what the projections compute in: the model's
                # dtype (autocast's, when on, is what the reducer gave)
                summaries = [z if z.dtype == q.dtype else z.to(q.dtype)
                             for z in summaries]
        elif self.shared:
            if assignment is None:
                raise ValueError('this layer has no reducer of its own and '
                                 'was given no assignment')
            summaries, assignments = [apply_assignment(assignment, x)], [
                assignment
            ]
        else:
            summaries, assignments = [x], []
        out = None
        for s, z in enumerate(summaries):
            if self._norm_names[s] is not None:
                z = getattr(self, self._norm_names[s])(z)
            k, v = self._key_value(s, z, q, x)
            o = multi_head_attention(q, k, v, self.num_heads)
            out = o if out is None else out + o
        return self.proj_drop(self.proj(out)), assignments


class ClusterAttention(SummaryAttention):
    """ClusTR's attention (the official parameter names).

    Default reducer: DPC-kNN at two scales (``N / sr^2`` and ``4 N / sr^2``
    clusters), cluster tokens the ``exp(weight_layer(x))``-weighted means of
    their members, one fused ``kv1`` / ``kv2`` projection per scale, outputs
    summed before ``proj``; full attention with ``kv`` where ``sr_ratio`` is
    1. ``reducer`` swaps the reducer (None: full attention at any
    ``sr_ratio``); the stage's ``sr_ratio``, ``window_size`` and
    ``max_chunk_elems`` are offered to it.

    Args:
        dim (int): Channels.
        num_heads (int): Heads (all heads attend to every scale).
        sr_ratio (int): Reduction ratio of the stage.
        qkv_bias (bool): Bias of q and kv projections. Default True.
        proj_drop (float): Dropout after ``proj``. Default 0.
        window_size (int, optional): Clustering window (tokens); None for the
            exact per-image clustering. Default None.
        max_chunk_elems (int, optional): Distance-chunk bound of the
            clustering (None: a per-device default).
        reducer (dict | TokenReducer | None | str): 'default' (above), a
            reducer config/module, or None.
        compact_qv (bool): Armour compact Q/V (see :class:`SummaryAttention`).
    """

    def __init__(self, dim: int, num_heads: int, sr_ratio: int,
                 qkv_bias: bool = True, proj_drop: float = 0.0,
                 window_size: Optional[int] = None,
                 max_chunk_elems: Optional[int] = None, *,
                 reducer: Union[ReducerCfg, str] = 'default',
                 compact_qv: bool = False):
        if isinstance(reducer, str):
            if reducer != 'default':
                raise ValueError(f"reducer must be 'default', a config, a "
                                 f'module or None, got {reducer!r}')
            reducer = (dict(type='DPCKNN', scale_factors=CLUSTR_SCALES)
                       if sr_ratio > 1 else None)
        super().__init__(
            dim, num_heads, reducer, qkv_bias=qkv_bias, kv_layout='fused',
            compact_qv=compact_qv, proj_drop=proj_drop,
            reducer_context=dict(sr_ratio=sr_ratio, window_size=window_size,
                                 max_chunk_elems=max_chunk_elems))
        self.sr_ratio = sr_ratio


class PaCaAttention(SummaryAttention):
    """Patch-to-cluster attention of PaCa-ViT (the official parameter names).

    Queries from the N tokens, keys/values (separate ``k``, ``v``) from M
    cluster tokens ``Z = cluster_norm(A X)``; plain multi-head self-attention
    when ``num_clusters == 0``. A layer either owns a clustering network
    (``clustering='conv'|'mlp'``: a :class:`~.reducers.SoftCluster`, or any
    ``reducer``) or (``clustering=None``) applies an assignment handed in by
    an earlier block of its stage or by the teacher network, each layer
    keeping its own cluster LayerNorm.

    Args:
        dim (int): Token channels.
        num_heads (int): Attention heads; must divide ``dim``.
        num_clusters (int): M; 0 for full self-attention.
        clustering (str | None): Own clustering network type, or None to
            reuse an external assignment. Ignored when ``num_clusters == 0``
            or a ``reducer`` is given.
        kernel_size (int): Depthwise kernel of the conv clustering. Default 7.
        mlp_ratio (int): Hidden ratio of the mlp clustering. Default 4.
        reducer (dict | TokenReducer, optional): Own reducer instead of the
            soft clustering; offered ``num_clusters``, ``kernel_size``,
            ``mlp_ratio`` and ``reducer_context``.
        compact_qv (bool): Armour compact Q/V (no ``v``).
        reducer_context (dict, optional): More stage settings for it.
    """

    def __init__(self,
                 dim: int,
                 num_heads: int,
                 num_clusters: int,
                 clustering: Optional[str] = None,
                 kernel_size: int = 7,
                 mlp_ratio: int = 4,
                 *,
                 reducer: ReducerCfg = None,
                 compact_qv: bool = False,
                 reducer_context: Optional[dict] = None):
        shared = False
        if num_clusters == 0:
            reducer = None
        elif reducer is None:
            if clustering in ('conv', 'mlp'):
                reducer = dict(type='SoftCluster', net=clustering,
                               kernel_size=kernel_size, mlp_ratio=mlp_ratio)
            elif clustering is None:
                shared = True
            else:
                raise ValueError(f"clustering must be 'conv', 'mlp' or None, "
                                 f'got {clustering!r}')
        super().__init__(
            dim, num_heads, reducer, shared=shared, kv_layout='split',
            summary_norm=True, compact_qv=compact_qv,
            reducer_context=dict(num_clusters=num_clusters,
                                 kernel_size=kernel_size, mlp_ratio=mlp_ratio,
                                 **(reducer_context or {})))
        self.num_clusters = num_clusters

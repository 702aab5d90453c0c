"""Cluster tokens: the weighted mean of each cluster's members, and the
clustering and that merge behind one op for the fused plan.

The merge of every scale fills one buffer of sums: row ``r`` holds
``[sum w x, sum w]`` of the tokens sent there (the clustered scales' rows,
scale by scale and image by image, then, where a scale is the identity, one
row per token: :func:`token_rows`), and each cluster token is
``sum w x / (sum w + 1e-6)``, the official normaliser.

:func:`cluster_and_merge` is what ClusTR's reducer calls. Under the fused
plan (CUDA with Triton, where every op dispatched costs host time at small
batches) it is one custom op, ``torch.ops.clustr_mm.dpc_knn_merge``: the
windows cut, the fused clustering, the ids' offsets, the token weights'
``exp`` and the merge (two Triton kernels, :func:`merge_kernels`, checked
against the torch merge on first use) behind one dispatch, with its
backward written out (:func:`merge_backward`, checked against autograd of
:func:`merge_sums` in the tests). Every other plan (blocked and reference backends, tracing,
ONNX export) and torch < 2.4 run the same body as plain torch calls, and
autograd follows them.
"""
import functools
from typing import List, Optional, Sequence, Tuple

import torch

from ...graph_safety import is_onnx_export
from .common import (BatchConsts, ClusteringPlan, ClusterIds, WindowLayout,
                     cluster_counts, concat_chunks, window_tokens)
from .dispatch import assign_clusters, batch_consts
from .first_use import checked_once
from .fused import HAS_CUSTOM_OP, libdevice, runs_kernels, tl, triton
from .fused import NAME as FUSED

EPS = 1e-6  # the normaliser's epsilon (official code)
# Tokens and channels per program of the merge kernels.
MERGE_BLOCK_T, MERGE_BLOCK_C = 64, 32

if triton is not None:

    @triton.jit
    def _merge_sums_kernel(x_ptr, w_ptr, ids_ptr, shift_ptr, sums_ptr,
                           rows_ptr, total, n, batch, first_identity,
                           C: tl.constexpr, S: tl.constexpr,
                           HAS_W: tl.constexpr, LOG_W: tl.constexpr,
                           IDENTITY: tl.constexpr, LIBDEVICE: tl.constexpr,
                           BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
        """Per token: its weight (``exp`` of a log-weight with LOG_W, 1
        without HAS_W), its row per merged scale (cluster id + the image's
        and scale's first row; with IDENTITY its own row after them),
        written to ``rows``, and ``[w x, w]`` added to each of those rows
        of ``sums`` (atomically: a cluster's members sit in many programs;
        own rows are stored). Grid: token blocks of the B * N tokens."""
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = t < total
        w = tl.full((BLOCK_T, ), 1.0, tl.float32)
        if HAS_W:
            w = tl.load(w_ptr + t, mask=tmask, other=0.0)
            if LOG_W:
                if LIBDEVICE:  # compiled: libdevice's exp, as torch's
                    w = libdevice.exp(w)
                else:  # Triton's interpreter: numpy's
                    w = tl.exp(w)
        image = t // n
        row0 = tl.load(ids_ptr + t, mask=tmask, other=0) + tl.load(
            shift_ptr + image, mask=tmask, other=0)
        tl.store(rows_ptr + t, row0, mask=tmask)
        row1 = row0
        if S > 1:
            row1 = tl.load(ids_ptr + total + t, mask=tmask, other=0) + (
                tl.load(shift_ptr + batch + image, mask=tmask, other=0))
            tl.store(rows_ptr + total + t, row1, mask=tmask)
        own = first_identity + t
        if IDENTITY:
            tl.store(rows_ptr + S * total + t, own, mask=tmask)
        for c0 in range(0, C, BLOCK_C):
            ch = c0 + tl.arange(0, BLOCK_C)
            m = tmask[:, None] & (ch[None, :] < C)
            v = tl.load(x_ptr + t[:, None] * C + ch[None, :], mask=m,
                        other=0.0) * w[:, None]
            tl.atomic_add(sums_ptr + row0[:, None] * (C + 1) + ch[None, :],
                          v, mask=m)
            if S > 1:
                tl.atomic_add(
                    sums_ptr + row1[:, None] * (C + 1) + ch[None, :], v,
                    mask=m)
            if IDENTITY:
                tl.store(sums_ptr + own[:, None] * (C + 1) + ch[None, :], v,
                         mask=m)
        tl.atomic_add(sums_ptr + row0 * (C + 1) + C, w, mask=tmask)
        if S > 1:
            tl.atomic_add(sums_ptr + row1 * (C + 1) + C, w, mask=tmask)
        if IDENTITY:
            tl.store(sums_ptr + own * (C + 1) + C, w, mask=tmask)

    @triton.jit
    def _merge_mean_kernel(sums_ptr, out_ptr, num_rows, C: tl.constexpr,
                           EPS_: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_C: tl.constexpr):
        """out = sums[:, :C] / (sums[:, C] + EPS_). Grid: row blocks."""
        r = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        rmask = r < num_rows
        den = tl.load(sums_ptr + r * (C + 1) + C, mask=rmask, other=1.0)
        den = den + EPS_
        for c0 in range(0, C, BLOCK_C):
            ch = c0 + tl.arange(0, BLOCK_C)
            m = rmask[:, None] & (ch[None, :] < C)
            v = tl.load(sums_ptr + r[:, None] * (C + 1) + ch[None, :],
                        mask=m, other=0.0)
            tl.store(out_ptr + r[:, None] * C + ch[None, :],
                     v / den[:, None], mask=m)


# layouts kept: three clustered stages at about ten input sizes (each
# holds its constants per batch size: at 800x1344, batch 2, a few MB)
@functools.lru_cache(maxsize=32)
def layout_for(hw: Tuple[int, int], window_size: Optional[int],
               sr_ratio: int, scale_factors: Tuple[int, ...], k: int,
               device: torch.device, plan: ClusteringPlan) -> WindowLayout:
    """The :class:`WindowLayout` of these sizes and plan, built once per
    process and shared (the reducers of a model with the same stage sizes,
    and the op, which is handed sizes, not layouts)."""
    return WindowLayout(hw, window_size, sr_ratio, scale_factors, device, k,
                        plan=plan)


def merge_shape(hw: Sequence[int], window_size: Optional[int],
                sr_ratio: int, scale_factors: Sequence[int],
                batch: int) -> Tuple[int, bool, int]:
    """(clustered scales, whether a scale is the identity, rows of the
    merge buffer) of ``batch`` images of an ``hw`` grid, from sizes alone
    (the op's fake implementation)."""
    tokens = window_tokens((int(hw[0]), int(hw[1])), window_size)
    counts = cluster_counts(tokens, sr_ratio, scale_factors)
    totals = [sum(c) for c in counts if c != tokens]
    identity = len(totals) < len(counts)
    return (len(totals), identity,
            batch * (sum(totals) + identity * sum(tokens)))


def token_rows(clustered: Optional[torch.Tensor],
               consts: BatchConsts) -> torch.Tensor:
    """(S'', B * N) the merge-buffer row of every token per merged scale:
    the ``clustered`` scales' ids (S', B, N) shifted to their image's and
    scale's rows, then (layouts with identity scales) the tokens' own
    rows."""
    parts = []
    if clustered is not None:
        parts.append((clustered + consts.merge_rows).flatten(1))
    if consts.identity_rows is not None:
        parts.append(consts.identity_rows)
    return concat_chunks(parts, 0)


def merge_sums(x: torch.Tensor, w: Optional[torch.Tensor], log_weights: bool,
               rows: torch.Tensor, zeros: torch.Tensor) -> torch.Tensor:
    """(R, C) cluster tokens: the w-weighted mean of the tokens that
    ``rows`` (S'', B * N) sends to each of the R rows of ``zeros``
    (R, C + 1).

    Args:
        x: (B, N, C) fp32 tokens.
        w: (B, N, 1) fp32 token weights (their logs with ``log_weights``),
            or None (the plain mean).
    """
    c = x.shape[-1]
    if w is None:
        src = torch.cat([x, x.new_ones(x.shape[:-1] + (1, ))], -1)
    else:
        if log_weights:
            w = w.exp()
        src = torch.cat([x * w, w], -1)
    src = src.reshape(-1, c + 1)
    total = zeros
    for index in rows:
        if is_onnx_export():
            # neither exporter takes index_add; scatter_add is the same sum
            # (ONNX ScatterElements, reduction 'add') in another order;
            # PyTorch's own forward keeps index_add
            total = total.scatter_add(0, index[:, None].expand_as(src), src)
        else:
            total = total.index_add(0, index, src)
    return total[:, :c] / (total[:, c:] + EPS)


def merge_torch(x: torch.Tensor, w: Optional[torch.Tensor],
                log_weights: bool, clustered: Optional[torch.Tensor],
                consts: BatchConsts) -> Tuple[torch.Tensor, torch.Tensor]:
    """(rows, merged) by torch calls: :func:`token_rows` of the clustered
    ids and :func:`merge_sums` (what :func:`merge_kernels` computes)."""
    rows = token_rows(clustered, consts)
    return rows, merge_sums(x, w, log_weights, rows, consts.merge_zeros)


def merge_backward(grad: torch.Tensor, merged: torch.Tensor,
                   x: torch.Tensor, w: Optional[torch.Tensor],
                   log_weights: bool, rows: torch.Tensor):
    """Gradients of :func:`merge_sums` w.r.t. ``x`` and ``w``: a row's
    mean ``m = sum w x / (d + eps)`` with ``d = sum w`` gives a member
    ``w g / (d + eps)`` and its weight ``(x . g - m . g) / (d + eps)``
    (times ``w`` for a log-weight), summed over the scales."""
    b, n, c = x.shape
    flat = x.reshape(-1, c)
    weight = flat.new_ones(b * n, 1) if w is None else w.reshape(-1, 1)
    if w is not None and log_weights:
        weight = weight.exp()
    den = flat.new_zeros(merged.shape[0], 1)
    for index in rows:
        den = den.index_add(0, index, weight)
    g = grad / (den + EPS)
    g_mean = (g * merged).sum(-1)
    index = rows.flatten()
    g_tok = g.index_select(0, index).view(-1, b * n, c).sum(0)
    g_mean_tok = g_mean.index_select(0, index).view(-1, b * n).sum(0)
    grad_x = (weight * g_tok).view(b, n, c)
    grad_w = None
    if w is not None:
        grad_w = (flat * g_tok).sum(-1) - g_mean_tok
        if log_weights:
            grad_w = grad_w * weight[:, 0]
        grad_w = grad_w.view(b, n, 1)
    return grad_x, grad_w


def _body(x: torch.Tensor, w: Optional[torch.Tensor], layout: WindowLayout,
          log_weights: bool) -> Tuple[ClusterIds, torch.Tensor, torch.Tensor]:
    """The clustering and merge: ids, rows and the (R, C) merged rows
    (B > 0); the merge in two kernels where the fused ones run
    (:func:`merge_kernels`), else torch calls."""
    ids = assign_clusters(x, layout)
    consts = batch_consts(layout, x.shape[0], x.shape[2])
    def torch_merge():
        return merge_torch(x, w, log_weights, ids.clustered, consts)

    if runs_kernels(x) and ids.clustered is not None:
        # the kernels' first use on a device is checked against torch
        key = (x.shape[2], ids.clustered.shape[0],
               consts.identity_rows is not None, w is not None, log_weights)
        rows, merged = checked_once(
            'merge', x, key, lambda: merge_kernels(
                x, w, log_weights, ids.clustered, consts), torch_merge,
            merge_disagreement)
        return ids, rows, merged
    return (ids, ) + torch_merge()


def merge_disagreement(got, ref) -> Optional[str]:
    """What differs between two (rows, merged) results, None if nothing
    beyond the sums' order: rows equal, cluster tokens within 1e-5 of the
    largest magnitude (fp32 sums in any order of the weights and tokens:
    measured 2.4e-7 on the tests' tokens)."""
    if not torch.equal(got[0], ref[0]):
        return f'{int((got[0] != ref[0]).sum())} token rows differ'
    diff = float((got[1] - ref[1]).abs().amax()) if ref[1].numel() else 0.0
    scale = float(ref[1].abs().amax()) if ref[1].numel() else 0.0
    if not diff <= 1e-5 * max(scale, 1.0):  # NaN too
        return f'cluster tokens differ by up to {diff:.3g} (of {scale:.3g})'
    return None


def merge_kernels(x: torch.Tensor, w: Optional[torch.Tensor],
                  log_weights: bool, clustered: torch.Tensor,
                  consts: BatchConsts) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_rows` and :func:`merge_sums` in three launches (the
    zeroed sums, :func:`_merge_sums_kernel`, :func:`_merge_mean_kernel`)
    instead of about ten; the sums are added atomically, in another order
    than ``index_add``'s on the CPU (fp32 round-off)."""
    s, b, n = clustered.shape
    c = x.shape[2]
    if s > 2:
        raise ValueError(f'the merge kernel merges at most 2 clustered '
                         f'scales, got {s}')
    identity = consts.identity_rows is not None
    total = b * n
    sums = torch.zeros_like(consts.merge_zeros)
    rows = torch.empty(s + identity, total, dtype=torch.long,
                       device=x.device)
    first = sums.shape[0] - total if identity else 0
    _merge_sums_kernel[(triton.cdiv(total, MERGE_BLOCK_T), )](
        x.contiguous(), x if w is None else w.contiguous(),
        clustered.contiguous(),
        consts.merge_rows, sums, rows, total, n, b, first, C=c, S=s,
        HAS_W=w is not None, LOG_W=log_weights,
        IDENTITY=identity, LIBDEVICE=x.is_cuda and libdevice is not None,
        BLOCK_T=MERGE_BLOCK_T, BLOCK_C=MERGE_BLOCK_C)
    merged = x.new_empty(sums.shape[0], c)
    _merge_mean_kernel[(triton.cdiv(sums.shape[0], MERGE_BLOCK_T), )](
        sums, merged, sums.shape[0], C=c, EPS_=EPS, BLOCK_T=MERGE_BLOCK_T,
        BLOCK_C=MERGE_BLOCK_C)
    return rows, merged


def _plan_args(plan: ClusteringPlan) -> Tuple[int, bool, bool, str]:
    return (plan.max_chunk_elems, plan.pad_windows, plan.blocked_knn,
            plan.precision)


def _op_layout(x, hw, window_size, sr_ratio, scale_factors, k,
               max_chunk_elems, pad_windows, blocked_knn, precision):
    plan = ClusteringPlan(max_chunk_elems, pad_windows, blocked_knn, FUSED,
                          precision)
    return layout_for((hw[0], hw[1]), window_size or None, sr_ratio,
                      tuple(scale_factors), k, x.device, plan)


def dpc_knn_merge_body(x: torch.Tensor, w: Optional[torch.Tensor],
                       hw: List[int], window_size: int, sr_ratio: int,
                       scale_factors: List[int], k: int, max_chunk_elems: int,
                       pad_windows: bool, blocked_knn: bool, precision: str,
                       log_weights: bool
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What ``torch.ops.clustr_mm.dpc_knn_merge`` runs: (S', B, N) ids of
    the clustered scales, (S'', B * N) rows and (R, C) merged rows of the
    tokens ``x``."""
    layout = _op_layout(x, hw, window_size, sr_ratio, scale_factors, k,
                        max_chunk_elems, pad_windows, blocked_knn, precision)
    ids, rows, merged = _body(x, w, layout, log_weights)
    return ids.clustered, rows, merged


# What :func:`merge_kernels` launches (checked under Triton's interpreter).
MERGE_LAUNCHES = ('zeros_like', '_merge_sums_kernel', '_merge_mean_kernel')


def gpu_launches(counting, x: torch.Tensor, w: Optional[torch.Tensor],
                 hw: List[int], window_size: int, sr_ratio: int,
                 scale_factors: List[int], k: int, *args) -> int:
    """The launches of one call of the op where the kernels run, for the
    op census on devices where they cannot: the windows' cut and the
    clustering as ``counting`` (a dispatch mode with a ``launches`` count,
    entered here) counts them, then :data:`MERGE_LAUNCHES`."""
    layout = _op_layout(x, hw, window_size, sr_ratio, scale_factors, k,
                        *args[:4])
    with counting:
        assign_clusters(x, layout)
    return counting.launches + len(MERGE_LAUNCHES)


if HAS_CUSTOM_OP:
    _op = torch.library.custom_op('clustr_mm::dpc_knn_merge',
                                  mutates_args=())(dpc_knn_merge_body)

    @_op.register_fake
    def _(x, w, hw, window_size, sr_ratio, scale_factors, *args):
        b, n, c = x.shape
        scales, identity, rows = merge_shape(hw, window_size or None,
                                             sr_ratio, scale_factors, b)
        return (x.new_empty((scales, b, n), dtype=torch.long),
                x.new_empty((scales + identity, b * n), dtype=torch.long),
                x.new_empty((rows, c)))

    def _setup(ctx, inputs, output):
        x, w, log_weights = inputs[0], inputs[1], inputs[-1]
        _, rows, merged = output
        ctx.log_weights = log_weights
        ctx.save_for_backward(x, w, rows, merged)

    def _backward(ctx, grad_ids, grad_rows, grad):
        if grad is None:
            return (None, ) * 12
        x, w, rows, merged = ctx.saved_tensors
        grad_x, grad_w = merge_backward(grad, merged, x, w, ctx.log_weights,
                                        rows)
        return (grad_x, grad_w) + (None, ) * 10

    _op.register_autograd(_backward, setup_context=_setup)

    try:
        from torch.utils.flop_counter import register_flop_formula
    except ImportError:
        register_flop_formula = None
    if register_flop_formula is not None:

        @register_flop_formula(torch.ops.clustr_mm.dpc_knn_merge)
        def _flops(x_shape, w_shape, hw, window_size, sr_ratio,
                   scale_factors, *args, out_shape=None, **kwargs):
            return dpc_knn_merge_flops(x_shape, hw, window_size or None,
                                       sr_ratio, scale_factors)


def dpc_knn_merge_flops(x_shape: Sequence[int], hw: Sequence[int],
                        window_size: Optional[int], sr_ratio: int,
                        scale_factors: Sequence[int]) -> int:
    """FLOPs of one op call (``torch.utils.flop_counter``'s convention, 2 a
    multiply-add): the fused DPC-kNN's on the padded windows of the grid
    (:func:`~.fused.dpc_knn_flops`) and the merge's weighted sums, a
    multiply-add per token, channel and merged scale."""
    from .fused import dpc_knn_flops
    b, _, c = x_shape
    h, w = int(hw[0]), int(hw[1])
    size = window_size or max(h, w)
    wh, ww = min(size, h), min(size, w)
    windows = b * -(-h // wh) * -(-w // ww)
    tokens = window_tokens((h, w), window_size)
    counts = [cnt for cnt in cluster_counts(tokens, sr_ratio, scale_factors)
              if cnt != tokens]
    merged = len(counts) + (len(counts) < len(scale_factors))
    centers = max((max(cnt) for cnt in counts), default=0)
    return (dpc_knn_flops(windows, wh * ww, c, centers) if counts else 0) + (
        2 * b * h * w * c * merged)


def cluster_and_merge(x: torch.Tensor, w: Optional[torch.Tensor],
                      layout: WindowLayout, log_weights: bool = False
                      ) -> Tuple[ClusterIds, torch.Tensor]:
    """Cluster ids of the (B, N, C) fp32 tokens ``x`` under ``layout``
    (:func:`~.dispatch.assign_clusters`) and the (R, C) merged rows of
    every scale (:func:`merge_sums`, ``w`` as there; :func:`split_scales`
    cuts them per scale). Under the fused plan, with torch's
    ``custom_op``, one op; else plain torch calls."""
    b, n, c = x.shape
    if not b:  # an empty batch (a size, not data: no sync)
        return (assign_clusters(x, layout),
                x.new_zeros(merge_shape(layout.hw, layout.window_size,
                                        layout.sr_ratio,
                                        layout.scale_factors, 0)[2], c))
    if not (HAS_CUSTOM_OP and layout.plan.kernel == FUSED
            and layout.clustered):
        ids, _, merged = _body(x, w, layout, log_weights)
        return ids, merged
    clustered, _, merged = torch.ops.clustr_mm.dpc_knn_merge(
        x, w, list(layout.hw), layout.window_size or 0, layout.sr_ratio,
        list(layout.scale_factors), layout.k, *_plan_args(layout.plan),
        log_weights)
    scales = [layout.token_ids.expand(b, -1)] * layout.num_scales
    for i, s in enumerate(layout.clustered):
        scales[s] = clustered[i]
    return ClusterIds(scales, clustered), merged


def split_scales(merged: torch.Tensor, layout: WindowLayout,
                 batch: int) -> List[torch.Tensor]:
    """Per scale, its (B, totals[s], C) view of the merged rows
    (:func:`cluster_and_merge`): the clustered scales in order, then the
    identity scales' tokens (one block shared by all of them)."""
    c = merged.shape[-1]
    n = layout.hw[0] * layout.hw[1]
    out, start = [], 0
    for s in range(layout.num_scales):
        if s in layout.clustered:
            size = batch * layout.totals[s]
            out.append(merged[start:start + size].view(
                batch, layout.totals[s], c))
            start += size
        else:
            out.append(None)
    if len(layout.clustered) == layout.num_scales:
        return out
    ident = merged[start:start + batch * n].view(batch, n, c)
    return [ident if z is None else z for z in out]

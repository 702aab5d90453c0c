"""Which backend clusters, with which plan, and the call that runs it over
a layout's windows: the one module that decides.

The backends, fastest first (:data:`BACKENDS`), each a module (or object)
with the interface of :class:`clustr_mm.protocols.ClusteringBackend`:
``NAME``; ``HOLDS_BLOCKS``, whether it keeps distance blocks (then it gets
as many windows per call as fit the plan's ``max_chunk_elems``);
``why_not(task)``, None where the dispatch may choose it by itself for a
:class:`~.common.Task` (device, dtype, sizes), else the reason it may not;
and ``run(x, counts, k, windows, plan)``, the (S, G, n) ids of G windows.

* :mod:`.fused`: Triton kernels in one custom op (CUDA with Triton), wrapped
  in :class:`~.first_use.Checked` (its first use on a device is checked
  against the blocked backend);
* :mod:`.blocked`: bounded distance blocks (CPUs, GPUs without Triton);
* :mod:`.reference`: the paper's five steps over whole blocks (the oracle
  of the tests; what ``torch.jit.trace`` records).

:func:`register_backend` adds another backend to that list.
:func:`choose_backend` walks the backends in that order and takes the first
that may run, with its plan for the device (:func:`default_plan`, here
too), or the one a given plan names, and keeps why each one before it was
not taken (:attr:`Choice.not_taken`, also logged at DEBUG level on the
logger of this module). :func:`assign_clusters` cuts a batch into the
layout's windows and hands each group of same-shaped windows to the chosen
backend, with the constants of that batch size (:func:`batch_consts`, made
once per size).
"""
import logging
from typing import NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ...graph_safety import is_compiling, is_onnx_export, is_tracing
from ...protocols import ClusteringBackend
from . import blocked, fused, reference
from .common import (BLOCK_BUDGET, BatchConsts, ClusteringPlan, ClusterIds,
                     GroupConsts, Padding, Task, WindowGroup, WindowLayout,
                     Windows, concat_chunks)
from .first_use import Checked

BACKENDS = (Checked(fused, blocked), blocked, reference)
logger = logging.getLogger(__name__)

# GPUs without Triton: launches and host round trips are what cost, so one
# block of up to 1 GiB fp32 and one padded call per stage (batch 2 at
# 800 x 1344: stage 1 in two blocks). CPUs: work and cache misses are what
# cost, so 4 MB blocks that stay in cache, no padded work and the blocked kNN
# (faster on CPUs than the accelerator plan: docs/benchmarks.md).
ACCELERATOR_PLAN = ClusteringPlan(BLOCK_BUDGET, True, False, blocked.NAME)
CPU_PLAN = ClusteringPlan(1 << 20, False, True, blocked.NAME)
# CUDA with Triton: one fused op per window group, border windows padded.
FUSED_PLAN = ClusteringPlan(BLOCK_BUDGET, True, False, fused.NAME)
# Under torch.jit.trace (FLOP counters, export): the reference, unpadded, so
# the traced GEMMs are exactly the algorithm's.
TRACE_PLAN = ClusteringPlan(BLOCK_BUDGET, False, False, reference.NAME)
# ONNX export (either exporter): the reference (written in what the
# exporters accept), border windows padded into one call per stage: up to 4x
# fewer ops in the graph than one call per window shape.
EXPORT_PLAN = ClusteringPlan(BLOCK_BUDGET, True, False, reference.NAME)


def default_plan(kernel: str, device: Optional[torch.device]) -> ClusteringPlan:
    """The plan backend ``kernel`` runs with on ``device`` (None: the CPU)
    when no plan is given: fused, :data:`FUSED_PLAN`; blocked,
    :data:`CPU_PLAN` on the CPU and :data:`ACCELERATOR_PLAN` elsewhere;
    reference, :data:`EXPORT_PLAN` in an ONNX export, else
    :data:`TRACE_PLAN`."""
    if kernel == fused.NAME:
        return FUSED_PLAN
    if kernel == reference.NAME:
        return EXPORT_PLAN if is_onnx_export() else TRACE_PLAN
    if kernel == blocked.NAME:
        cpu = device is None or device.type == 'cpu'
        return CPU_PLAN if cpu else ACCELERATOR_PLAN
    if kernel in _REGISTERED_PLANS:
        return _REGISTERED_PLANS[kernel]
    names = [b.NAME for b in BACKENDS]
    raise ValueError(f'kernel must be one of {names}, got {kernel!r}')


class Choice(NamedTuple):
    """The dispatch's decision: the backend's name, the plan it runs with,
    and ``(name, reason)`` of each backend before it that was not taken."""
    backend: str
    plan: ClusteringPlan
    not_taken: Tuple[Tuple[str, str], ...]


def choose_backend(task: Task,
                   plan: Optional[ClusteringPlan] = None) -> Choice:
    """The backend that clusters ``task`` (:class:`~.common.Task`: device,
    dtype, sizes).

    Without a ``plan`` the first of :data:`BACKENDS` whose ``why_not`` has
    no objection, with its plan for the device; with one, the backend the
    plan names (``plan.kernel``), with that plan.
    """
    not_taken = []
    for backend in BACKENDS:
        if plan is not None:
            reason = (None if plan.kernel == backend.NAME else
                      f'the plan names {plan.kernel!r}')
        else:
            reason = backend.why_not(task)
        if reason is None:
            choice = Choice(backend.NAME,
                            plan or default_plan(backend.NAME, task.device),
                            tuple(not_taken))
            if not is_compiling():
                logger.debug('DPC-kNN on %s (%s, k %d, %d scales): %s '
                             'backend; %s', task.device or 'cpu',
                             str(task.dtype).replace('torch.', ''), task.k,
                             task.scales, backend.NAME, '; '.join(
                                 f'not {n}: {r}' for n, r in not_taken)
                             or 'the first choice')
            return choice
        not_taken.append((backend.NAME, reason))
    names = [b.NAME for b in BACKENDS]
    raise ValueError(f'plan.kernel must be one of {names}, got '
                     f'{plan.kernel!r}')


def plan_for(device: Optional[torch.device]) -> ClusteringPlan:
    """The plan :func:`choose_backend` picks on ``device`` for ClusTR's
    clustering (k = 5, two scales, fp32)."""
    return choose_backend(Task(device)).plan


_RUN = {b.NAME: b for b in BACKENDS}
_REGISTERED_PLANS = {}  # NAME -> default plan of a registered backend


def register_backend(backend: ClusteringBackend, plan: ClusteringPlan,
                     before: Optional[str] = None) -> None:
    """Add ``backend`` to :data:`BACKENDS`, tried before the backend named
    ``before`` (None: after all but the reference, the last resort), with
    ``plan`` as its default plan (``plan.kernel`` must be its ``NAME``).
    From then on :func:`choose_backend` may take it for a task its
    ``why_not`` accepts, and a plan that names it runs it."""
    global BACKENDS
    if not isinstance(backend, ClusteringBackend):
        raise TypeError(f'{backend!r} is not a clustering backend: it needs '
                        'NAME, HOLDS_BLOCKS, why_not(task) and run(x, counts, '
                        'k, windows, plan) (clustr_mm.protocols)')
    if backend.NAME in _RUN:
        raise ValueError(f'a backend named {backend.NAME!r} is registered')
    if plan.kernel != backend.NAME:
        raise ValueError(f'the default plan of {backend.NAME!r} names '
                         f'{plan.kernel!r}; give plan.kernel='
                         f'{backend.NAME!r}')
    names = [b.NAME for b in BACKENDS]
    if before is not None and before not in names:
        raise ValueError(f'before={before!r}: the backends are {names}')
    at = names.index(before or reference.NAME)
    BACKENDS = BACKENDS[:at] + (backend, ) + BACKENDS[at:]
    _RUN[backend.NAME] = backend
    _REGISTERED_PLANS[backend.NAME] = plan


@torch.no_grad()
def assign_clusters(x: torch.Tensor, layout: WindowLayout) -> ClusterIds:
    """Cluster id of every token per scale (fp32, no grad, no autocast), by
    the backend of ``layout.plan``.

    Args:
        x: (B, N, C) tokens of the grid described by ``layout``.
        layout: Windows, cluster counts and plan (:class:`WindowLayout`).

    Returns:
        :class:`ClusterIds`: per scale (B, N) long ids in
        ``[0, layout.totals[s])``, numbered window by window (row-major), by
        center score inside a window; identity scales get ``arange(N)``.
    """
    b, n_tok, c = x.shape
    scales = layout.clustered
    identity = [layout.token_ids.expand(b, -1)] * layout.num_scales
    if not scales or not b:  # (sizes, not data: no sync)
        return ClusterIds(identity, None)
    h, w = layout.hw
    plan = layout.plan
    backend = _RUN[plan.kernel]
    budget = plan.max_chunk_elems
    consts = batch_consts(layout, b, c)
    with torch.autocast(x.device.type, enabled=False):
        grid = x.detach().float().reshape(b, h, w, c)
        outs = []
        for grp, group in zip(layout.groups, consts.groups):
            (r0, r1), (c0, c1) = grp.rows, grp.cols
            (sh, sw), (gh, gw), (ph, pw) = grp.window, grp.grid, grp.pad
            part = grid[:, r0:r1, c0:c1]
            if ph or pw:
                part = F.pad(part, (0, 0, 0, pw, 0, ph))
            n = sh * sw
            win = part.reshape(b, gh, sh, gw, sw, c).transpose(2, 3).reshape(
                -1, n, c)
            counts = [grp.counts[s] for s in scales]
            # Whole windows per call, as many as fit the block budget (a
            # backend that keeps no block: all in one call).
            per_call = (max(1, budget // (n * n)) if backend.HOLDS_BLOCKS
                        else win.shape[0])
            parts = []
            if is_onnx_export():
                # one call whatever the batch: a loop over blocks of
                # windows would fix the batch in the graph (torch.export
                # specialises it)
                parts.append(backend.run(win, counts, layout.k,
                                         group.windows, plan))
            for g0 in ([] if is_onnx_export() else
                       range(0, win.shape[0], per_call)):
                sl = (slice(0, None) if per_call >= win.shape[0] else
                      slice(g0, g0 + per_call))
                parts.append(backend.run(win[sl], counts, layout.k,
                                         window_block(group.windows, sl),
                                         plan))
            local = concat_chunks(parts, 1)
            if layout.token_pos is None:
                stacked = local.view(len(scales), b, n_tok)
                break
            outs.append((local.view(len(scales), b, gh * gw, n) +
                         group.offsets).flatten(2))
        else:
            stacked = concat_chunks(outs, 2).index_select(2, layout.token_pos)
    for i, s in enumerate(scales):
        identity[s] = stacked[i]
    return ClusterIds(identity, stacked, consts)


def window_block(windows: Windows, sl: slice) -> Windows:
    """The windows ``sl`` of ``windows`` (one block of them)."""
    if sl == slice(0, None):
        return windows
    padding = windows.padding
    if padding is not None:
        padding = Padding(padding.invalid[sl], None if padding.knn_scale
                          is None else padding.knn_scale[sl])
    return Windows(windows.ones[sl], windows.positions, windows.inf, padding,
                   None if windows.center_slots is None else
                   windows.center_slots[:, sl])


def batch_consts(layout: WindowLayout, batch: int,
                 channels: int) -> BatchConsts:
    """What the backends and the merge read besides the tokens, for
    ``batch`` images of ``channels`` under ``layout`` (its
    :attr:`~.common.WindowLayout.clustered` scales); kept in
    ``layout.batches``, except while tracing."""
    key = (batch, channels)
    # a traced (symbolic) batch size is neither kept nor hashable
    if not is_tracing() and key in layout.batches:
        return layout.batches[key]
    dev = layout.device
    inf = torch.tensor(float('inf'), device=dev)
    # no clustered scale (every token its own cluster): nothing to cluster,
    # only the merge's rows
    groups = tuple(_group_consts(layout, grp, batch, inf)
                   for grp in layout.groups) if layout.clustered else ()
    totals = [layout.totals[s] for s in layout.clustered]
    rows = batch * sum(totals)
    identity_rows = None
    if len(totals) < layout.num_scales:
        n = layout.hw[0] * layout.hw[1]
        identity_rows = (torch.arange(batch * n, device=dev) + rows)[None]
        rows += batch * n
    consts = BatchConsts(
        groups, merge_rows(batch, totals, dev), identity_rows,
        torch.zeros(rows, channels + 1, device=dev))
    if not is_tracing():
        layout.batches[key] = consts
    return consts


def _group_consts(layout: WindowLayout, grp: WindowGroup, batch: int,
                  inf: torch.Tensor) -> GroupConsts:
    """One window group's :class:`~.common.Windows` (padding masks, center
    slots) and cluster offsets for ``batch`` images."""
    (sh, sw), (gh, gw) = grp.window, grp.grid
    (r0, r1), (c0, c1) = grp.rows, grp.cols
    scales = layout.clustered
    dev, n = layout.device, sh * sw
    positions = torch.arange(n, device=dev)
    padding = center_slots = None
    if any(grp.pad):
        r = torch.arange(gh, device=dev)[:, None] * sh + torch.arange(
            sh, device=dev)
        c = torch.arange(gw, device=dev)[:, None] * sw + torch.arange(
            sw, device=dev)
        invalid = ~((r < r1 - r0)[:, None, :, None] &
                    (c < c1 - c0)[None, :, None, :])
        invalid = invalid.reshape(gh * gw, n).repeat(batch, 1)
        tokens = [layout.tokens[i] for i in grp.index]
        k_eff = min(layout.k, n)
        knn_scale = None
        if min(tokens) < k_eff:
            knn_scale = torch.tensor(
                [k_eff / min(k_eff, t) for t in tokens],
                device=dev).repeat(batch)[:, None]
        padding = Padding(invalid, knn_scale)
    counts = [[layout.counts[s][i] for i in grp.index] for s in scales]
    if len(counts) > 1 or len(set(counts[0])) > 1:
        num = max(max(c) for c in counts)
        cnt = torch.tensor(counts, device=dev)  # (S, windows)
        center_slots = (positions[:num] < cnt[..., None]).repeat(
            1, batch, 1)
    offsets = layout.offsets[list(scales)][:, grp.index][:, None, :, None]
    windows = Windows(torch.ones(batch * gh * gw, n, 1, device=dev),
                      positions, inf, padding, center_slots)
    return GroupConsts(windows, offsets)


def merge_rows(batch: int, totals: Sequence[int],
               device: Optional[torch.device] = None) -> torch.Tensor:
    """(S, B, 1) row of cluster 0 of image b in scale s of the merge's
    sums: earlier scales' rows + b * totals[s], so one scatter fills every
    scale."""
    # batch * (earlier totals) as a product of tensors, not a list of ints:
    # under a trace ``batch`` is traced, so an exported graph takes its
    # batch from the input instead of keeping the example's
    earlier = [sum(totals[:t]) for t in range(len(totals))]
    return (torch.tensor(earlier, device=device)[:, None] * batch +
            torch.tensor(totals, device=device)[:, None] *
            torch.arange(batch, device=device))[..., None]

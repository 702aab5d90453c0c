"""Which backend clusters, and the call that runs it over a layout's windows.

The backends, fastest first (:data:`BACKENDS`), each a module with the same
four names: ``NAME``; ``why_not(device)``, None where the dispatch may
choose it by itself, else the reason it may not; ``plan_for(device)``, its
:class:`~.common.ClusteringPlan` there; and ``run(x, counts, k, windows,
plan)``, the (S, G, n) ids of G windows.

* :mod:`.fused`: Triton kernels in one custom op (CUDA with Triton);
* :mod:`.blocked`: bounded distance blocks (CPUs, GPUs without Triton);
* :mod:`.reference`: the paper's five steps over whole blocks (the oracle
  of the tests; what ``torch.jit.trace`` records).

:func:`choose_backend` is the one place that decides: it walks the backends
in that order and takes the first that may run, or the one a given plan
names, and keeps why each one before it was not taken
(:attr:`Choice.not_taken`, also logged at DEBUG level on the logger of this
module). :func:`assign_clusters` cuts a batch into the layout's windows and
hands each group of same-shaped windows to the chosen backend.
"""
import logging
from typing import NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from ..graph_safety import is_compiling, is_onnx_export
from . import blocked, first_use, fused, reference
from .common import ClusteringPlan, ClusterIds, WindowLayout, join

BACKENDS = (fused, blocked, reference)
logger = logging.getLogger(__name__)


class Choice(NamedTuple):
    """The dispatch's decision: the backend's name, the plan it runs with,
    and ``(name, reason)`` of each backend before it that was not taken."""
    backend: str
    plan: ClusteringPlan
    not_taken: Tuple[Tuple[str, str], ...]


def choose_backend(device: Optional[torch.device],
                   plan: Optional[ClusteringPlan] = None) -> Choice:
    """The backend that clusters tensors on ``device`` (None: the CPU).

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
            reason = backend.why_not(device)
        if reason is None:
            choice = Choice(backend.NAME, plan or backend.plan_for(device),
                            tuple(not_taken))
            if not is_compiling():
                logger.debug('DPC-kNN on %s: %s backend; %s', device,
                             backend.NAME, '; '.join(
                                 f'not {n}: {r}' for n, r in not_taken)
                             or 'the first choice')
            return choice
        not_taken.append((backend.NAME, reason))
    names = [b.NAME for b in BACKENDS]
    raise ValueError(f'plan.kernel must be one of {names}, got '
                     f'{plan.kernel!r}')


def plan_for(device: Optional[torch.device]) -> ClusteringPlan:
    """The plan :func:`choose_backend` picks for ``device``."""
    return choose_backend(device).plan


_RUN = {b.NAME: b for b in BACKENDS}


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
    todo = layout.clustered
    if not todo or not b:  # (sizes, not data: no sync)
        return layout.identity_ids(b)
    h, w = layout.hw
    plan = layout.plan
    backend = _RUN[plan.kernel]
    # the fused kernels are checked against the blocked backend on their
    # first use on a device (first_use)
    run = first_use.run_checked if backend is fused else backend.run
    budget = plan.max_chunk_elems
    consts = layout.batch_consts(b, c)
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
            counts = [grp.counts[s] for s in todo]
            # Whole windows per call, as many as fit the block budget (the
            # fused kernel keeps no block: all in one call).
            per_call = (win.shape[0] if plan.kernel == 'fused' else
                        max(1, budget // (n * n)))
            parts = []
            if is_onnx_export():
                # one call whatever the batch: a loop over blocks of
                # windows would fix the batch in the graph (torch.export
                # specialises it)
                parts.append(run(win, counts, layout.k, group.windows,
                                 plan))
            for g0 in ([] if is_onnx_export() else
                       range(0, win.shape[0], per_call)):
                sl = (slice(0, None) if per_call >= win.shape[0] else
                      slice(g0, g0 + per_call))
                parts.append(run(win[sl], counts, layout.k,
                                 group.windows.cut(sl), plan))
            local = join(parts, 1)
            if layout.token_pos is None:
                stacked = local.view(len(todo), b, n_tok)
                break
            outs.append((local.view(len(todo), b, gh * gw, n) +
                         group.offsets).flatten(2))
        else:
            stacked = join(outs, 2).index_select(2, layout.token_pos)
    ids = [layout.token_ids.expand(b, -1)] * len(layout.identity)
    for i, s in enumerate(todo):
        ids[s] = stacked[i]
    return ClusterIds(ids, stacked)

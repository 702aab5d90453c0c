"""What each part of clustr_mm that others read across layers must provide,
declared once.

A new token reducer, clustering backend, backbone or checkpoint converter is
written against these declarations; the readers (FLOP counting in
``analysis.flops``, the ONNX exporter, checkpoint loading, the clustering
dispatch) go through the accessors below, never through a bare ``getattr``:

- every module: ``flop_kind`` (:data:`FLOP_KINDS`, class or instance
  attribute), the category ``analysis.flops`` counts its work in; an
  attention module may add ``clustering_ops`` (aten op names it runs that
  make summary tokens, counted as clustering); a module whose graph is
  right only at the traced height and width sets ``graph_static_hw = True``
  (the exporter then refuses dynamic shapes for it);
- a backbone: ``strides`` (each stage's output stride) and, optionally, a
  ``upgrade_state_dict(state) -> state`` static method that maps an earlier
  key layout of its own to today's (checkpoint loading applies it);
- a clustering backend (:class:`ClusteringBackend`): a module or object
  with ``NAME``, ``HOLDS_BLOCKS``, ``why_not(task)`` and ``run(...)``; one
  whose first use is checked (:class:`CheckedBackend`) also has
  ``runs_kernels(x)`` and ``probed(...)``;
- a token reducer: :class:`~clustr_mm.models.layers.token_reducer.TokenReducer`
  (its own module documents the call);
- a checkpoint converter: :class:`~clustr_mm.checkpoints.official.Converter`.

This module imports nothing of clustr_mm, so every layer may read it.
"""
from typing import (Any, Callable, Mapping, Optional, Protocol, Tuple,
                    runtime_checkable)

FLOP_KINDS = ('embedding', 'attention', 'clustering', 'mlp')


def flop_kind(module: Any) -> Optional[str]:
    """The FLOP category ``module`` declares, or None for an unmarked one.

    Raises:
        ValueError: a ``flop_kind`` outside :data:`FLOP_KINDS`.
    """
    kind = getattr(module, 'flop_kind', None)
    if kind is not None and kind not in FLOP_KINDS:
        raise ValueError(f'{type(module).__name__}.flop_kind={kind!r}: '
                         f'must be one of {FLOP_KINDS}')
    return kind


def clustering_ops(module: Any) -> Tuple[str, ...]:
    """The aten ops of an attention module counted as clustering."""
    return tuple(getattr(module, 'clustering_ops', ()))


def graph_static_hw(module: Any) -> bool:
    """Whether a graph of ``module`` holds only at its traced size."""
    return bool(getattr(module, 'graph_static_hw', False))


def backbone_strides(backbone_cls: Any) -> Optional[Tuple[int, ...]]:
    """Each stage's output stride, as the backbone class declares it (None
    for a backbone that does not)."""
    strides = getattr(backbone_cls, 'strides', None)
    return None if strides is None else tuple(strides)


def state_dict_upgrade(model: Any) -> Optional[Callable[[Mapping], Mapping]]:
    """The backbone's ``upgrade_state_dict`` (earlier key layouts -> its
    own), or None where it has none."""
    return getattr(model, 'upgrade_state_dict', None)


@runtime_checkable
class ClusteringBackend(Protocol):
    """One way to compute DPC-kNN cluster ids (a module such as
    ``clustr_mm.ops.dpc_knn.blocked``): ``NAME`` is what a plan's ``kernel``
    names it; ``HOLDS_BLOCKS`` whether it keeps (n, n) distance blocks (the
    dispatch then bounds the windows per call by the plan's
    ``max_chunk_elems``); ``why_not(task)`` is None where it may run a
    ``dpc_knn.Task`` (device, dtype, k, scales; a reason otherwise: the
    dispatch reports it); ``run(x, counts, k, windows, plan)`` maps (G, n,
    C) tokens of G windows to per-scale ids."""
    NAME: str
    HOLDS_BLOCKS: bool

    def why_not(self, task) -> Optional[str]:
        ...

    def run(self, x, counts, k, windows, plan):
        ...


@runtime_checkable
class CheckedBackend(ClusteringBackend, Protocol):
    """A backend that ``dpc_knn.first_use.Checked`` can check against an
    oracle: ``runs_kernels(x)``, whether its own code runs on ``x`` (else
    it computes with another backend and there is nothing to check);
    ``probed(x, counts, k, windows, plan)``, its ids and intermediate values
    (``knn``, ``first``, ``rho``, ``delta2``, ``dmax2``, ``centers``) for the
    comparison."""

    def runs_kernels(self, x) -> bool:
        ...

    def probed(self, x, counts, k, windows, plan):
        ...

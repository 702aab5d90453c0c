"""The token-reducer interface: N patch tokens -> a few summary tokens for
keys/values.

ClusTR, PaCa-ViT, PVT and Centroid Transformers all attend from every token
to a smaller set of *summary* tokens; they differ only in how the summary is
formed. Each way is a registered :class:`TokenReducer` with one interface::

    reduction = reducer(x, hw, weights=None)
    reduction.tokens       # per scale: (B, M_s, C) summary tokens
    reduction.assignments  # per scale: which tokens each summary came from

``x`` is (B, N, C) with ``N = H * W`` tokens of the ``hw = (H, W)`` grid;
``weights`` optional (B, N, 1) positive token weights (ClusTR's learned
``exp(weight_layer(x))``), used by reducers that merge tokens. Assignments,
for visualisation (and, for shareable reducers, for reuse by later blocks),
are either hard ids (B, N) long (``-1`` = token not assigned) or soft
weights (B, M, N) float. A reducer keeps none of them: the attention returns
them, its block too, and the backbone's stage collects them (its
``keep_assignments``).

The reducers: :class:`~.dpc_knn.DPCKNN` (ClusTR) and those of
:mod:`~.reducers` (PaCa-ViT's soft clustering, PVT's grid pooling,
Centroid Transformers' centroid attention).
"""
import inspect
from typing import List, NamedTuple, Optional, Tuple, Union

import torch
from mmengine.registry import MODELS
from torch import nn

Grid = Tuple[int, int]


class Reduction(NamedTuple):
    """What a reducer returns: per-scale summary tokens and assignments."""
    tokens: List[torch.Tensor]
    assignments: List[torch.Tensor]


class TokenReducer(nn.Module):
    """Base of the reducers (see the module docstring for the interface).

    Class attributes a subclass may change:
        num_scales (int): Summary sets per call (each gets its own key/value
            projection in the attention; their outputs are summed).
        uses_token_weights (bool): Whether the attention should give it
            learned token weights (creates the attention's ``weight_layer``).
        takes_log_weights (bool): Whether the attention hands it the token
            weights' logs (``log_weights=``, the ``weight_layer`` output)
            instead of the weights, so that it can fold the ``exp`` into
            its own op (ClusTR's fused clustering and merge).
        shareable (bool): Whether its assignment can be applied to other
            tokens (:func:`apply_assignment`), so later blocks of a stage may
            reuse it (PaCa's stage-wise clustering).
        fp32 (bool): Whether it computes in fp32 whatever the autocast: the
            attention then hands it the tokens cast to fp32 once and makes
            the token weights from them in fp32 too.
        flop_kind (str): 'clustering': how ``analysis.flops`` sorts the
            work of a reducer (see ``SummaryAttention.flop_kind``).
    """
    num_scales = 1
    flop_kind = 'clustering'  # what analysis.flops counts its work as
    uses_token_weights = False
    takes_log_weights = False
    shareable = False
    fp32 = False

    def num_tokens(self, hw: Grid) -> List[int]:
        """Summary tokens per scale for a grid of ``hw`` tokens."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor, hw: Grid,
                weights: Optional[torch.Tensor] = None) -> Reduction:
        raise NotImplementedError


def build_reducer(cfg: Union[dict, TokenReducer], **context) -> TokenReducer:
    """Build a reducer from ``cfg``, filling in the stage's settings.

    Every ``context`` entry (e.g. ``dim``, ``sr_ratio``, ``num_heads``,
    ``num_clusters``, ``window_size``) that the reducer's constructor accepts
    and ``cfg`` does not set is passed to it, so one config such as
    ``dict(type='GridPool')`` serves every stage of a pyramid. A cfg key set
    to None is kept (e.g. ``num_clusters=None`` to ignore PaCa's count).
    A ready module is returned as is.
    """
    if isinstance(cfg, TokenReducer):
        return cfg
    if not isinstance(cfg, dict) or 'type' not in cfg:
        raise ValueError(f'a reducer config must be a dict with a type, got '
                         f'{cfg!r}')
    cfg = dict(cfg)
    cls = _reducer_type(cfg.pop('type'))
    accepted = inspect.signature(cls.__init__).parameters
    for key, value in context.items():
        if key in accepted and key not in cfg:
            cfg[key] = value
    return cls(**cfg)


def _reducer_type(name) -> type:
    cls = MODELS.get(name) if isinstance(name, str) else name
    if not (isinstance(cls, type) and issubclass(cls, TokenReducer)):
        raise ValueError(f'reducer type {name!r} is not a registered '
                         f'TokenReducer (e.g. DPCKNN, SoftCluster, '
                         f'CentroidAttention, GridPool)')
    return cls


def reducer_class(cfg: Union[dict, TokenReducer, None]) -> Optional[type]:
    """The class a reducer config builds (None for None)."""
    if cfg is None or isinstance(cfg, TokenReducer):
        return None if cfg is None else type(cfg)
    if not isinstance(cfg, dict) or 'type' not in cfg:
        raise ValueError(f'a reducer config must be a dict with a type, got '
                         f'{cfg!r}')
    return _reducer_type(cfg['type'])


def apply_assignment(assignment: torch.Tensor,
                     x: torch.Tensor) -> torch.Tensor:
    """Summary tokens of ``x`` (B, N, C) under a soft (B, M, N) assignment.

    ``A X``: each summary token is the assignment-weighted sum of the tokens
    (PaCa: convex combinations, as the softmax runs over the tokens).
    """
    return torch.bmm(assignment.to(x.dtype), x)


def assignment_map(assignment: torch.Tensor, hw: Grid) -> torch.Tensor:
    """Detached assignment on the grid: (B, M, H, W) soft, (B, H, W) hard."""
    a = assignment.detach()
    if a.dtype == torch.long:
        return a.reshape(a.shape[0], *hw)
    return a.reshape(a.shape[0], a.shape[1], *hw)


def reducer_accepts(cfg: Union[dict, TokenReducer]) -> frozenset:
    """The stage settings a reducer config takes from its stage: the
    constructor arguments it accepts and does not set itself (none for a
    ready module)."""
    cls = reducer_class(cfg)
    if isinstance(cfg, TokenReducer):
        return frozenset()
    accepted = set(inspect.signature(cls.__init__).parameters) - {'self'}
    return frozenset(accepted - set(cfg))

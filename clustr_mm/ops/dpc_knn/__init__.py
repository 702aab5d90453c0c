"""DPC-kNN token clustering, the op behind ClusTR's key/value reducer
(:class:`clustr_mm.models.layers.DPCKNN`).

Read in this order: :mod:`.reference` (the algorithm in the paper's five
steps, the oracle of the tests), :mod:`.dispatch` (which backend runs with
which plan, and why not the others), :mod:`.common` (the window layout and
the typed window constants). :mod:`.blocked` and :mod:`.fused` are the fast
backends; :mod:`.first_use` checks the fused one against the blocked one on
its first use on a device, with :mod:`.agreement`'s bounds.
"""
from .common import CLUSTR_SCALES, ClusteringPlan, ClusterIds, Task, WindowLayout
from .dispatch import (ACCELERATOR_PLAN, CPU_PLAN, EXPORT_PLAN, FUSED_PLAN,
                       TRACE_PLAN, Choice, assign_clusters, batch_consts,
                       choose_backend, default_plan, plan_for,
                       register_backend)

__all__ = [
    'assign_clusters', 'choose_backend', 'Choice', 'plan_for', 'default_plan',
    'register_backend',
    'batch_consts', 'ClusteringPlan', 'ClusterIds', 'Task', 'WindowLayout',
    'CLUSTR_SCALES', 'ACCELERATOR_PLAN', 'CPU_PLAN', 'EXPORT_PLAN',
    'FUSED_PLAN', 'TRACE_PLAN'
]

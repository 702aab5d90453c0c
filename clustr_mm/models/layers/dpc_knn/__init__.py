"""DPC-kNN token clustering, ClusTR's key/value reducer.

Read in this order: :mod:`.reducer` (:class:`DPCKNN`: layout, assign,
merge), :mod:`.reference` (the algorithm in the paper's five steps, the
oracle of the tests), :mod:`.dispatch` (which backend runs, and why not the
others). :mod:`.common` holds the plans (and which one each backend runs with),
the window layout and the typed window constants; :mod:`.blocked` and :mod:`.fused` are the fast backends.
"""
from .common import (ACCELERATOR_PLAN, CLUSTR_SCALES, CPU_PLAN, FUSED_PLAN,
                     TRACE_PLAN, ClusteringPlan, ClusterIds, WindowLayout,
                     default_plan)
from .dispatch import (Choice, assign_clusters, batch_consts, choose_backend,
                       plan_for)
from .reducer import DPCKNN, merge_clusters, use_plan

__all__ = [
    'DPCKNN', 'assign_clusters', 'merge_clusters', 'choose_backend',
    'Choice', 'plan_for', 'default_plan', 'batch_consts', 'use_plan',
    'ClusteringPlan', 'ClusterIds',
    'WindowLayout', 'CLUSTR_SCALES', 'ACCELERATOR_PLAN', 'CPU_PLAN',
    'FUSED_PLAN', 'TRACE_PLAN'
]

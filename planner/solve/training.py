"""The whole planner: the search, the baselines beside it, and the fastest of them all.

    result = plan_training(profile, cluster, PlanOptions(global_batch=512))
    result.plan            # pipelines, stages, batch shares, micro-batches, predictions
    result.sim             # the simulated iteration of the chosen plan
    result.baselines       # uniform, DeepSpeed's, homogeneous, data parallel: each scored the same way

The one module that depends on both :mod:`hetplan.solve.search` and :mod:`hetplan.solve.baselines`,
so neither depends on the other's caller: baselines that run a planner of their own (the
homogeneous ones) call the search alone.
"""

from __future__ import annotations

from collections.abc import Callable

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.solve.baselines import baseline_plans
from hetplan.solve.search import PlanOptions, PlanResult, best_plan, search_plans

__all__ = ["plan_training"]


def plan_training(
    profile: ModelProfile,
    cluster: Cluster,
    opts: PlanOptions,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Search for the fastest plan, score the baselines on the same simulator, keep the fastest
    (baselines are candidates too: the plan is never slower than any of them)."""
    searched = search_plans(profile, cluster, opts, progress=progress)
    baselines = {}
    if opts.baselines:
        reference = min(searched.scored, key=lambda c: c.sim.iteration_s).plan if searched.scored else None
        baselines = baseline_plans(profile, cluster, opts, reference)
    return best_plan(searched, baselines, profile, cluster, opts)

"""The heterogeneity-aware planner: structures, exact partitions, batch shares, micro-batches.

    result = plan_training(profile, cluster, PlanOptions(global_batch=512))
    plan = finalize_plan(result, profile_path=..., cluster_path=..., output="plan.yaml", ...)
    plan.save("plan.yaml")

The solver never imports torch; it scores candidates with :mod:`hetplan.simulate`.
"""

from hetplan.solve.planfile import finalize_plan
from hetplan.solve.search import PlanOptions, PlanResult
from hetplan.solve.training import plan_training

__all__ = ["PlanOptions", "PlanResult", "finalize_plan", "plan_training"]

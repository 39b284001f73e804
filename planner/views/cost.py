"""What a step costs, as JSON fields: the same figures ``show`` and ``compare`` print as text.

    step_cost(0.5, 512, 52.32)  # {"usd_per_hour": 52.32, "usd_per_step": 0.00727, "usd_per_sample": 1.4e-05}

Every node of the cluster is paid for, idle or not (prices from the catalog or a cluster file's
``price_per_hour``), so a plan's cost per step is the cluster's price per hour times its iteration
time. ``None`` where the cluster is not priced or the plan has no time (it does not fit): a script
reading ``--json`` then tells "free" from "unknown".
"""

from __future__ import annotations

from typing import Any

__all__ = ["step_cost", "with_costs"]


def step_cost(iteration_s: float | None, global_batch: int, usd_per_hour: float | None) -> dict[str, float | None]:
    """$/hour, $/step and $/sample of one plan on a cluster costing ``usd_per_hour``."""
    if usd_per_hour is None or iteration_s is None:
        return {"usd_per_hour": usd_per_hour, "usd_per_step": None, "usd_per_sample": None}
    step = usd_per_hour * iteration_s / 3600.0
    return {"usd_per_hour": usd_per_hour, "usd_per_step": step, "usd_per_sample": step / global_batch}


def with_costs(rows: list[dict[str, Any]], global_batch: int, usd_per_hour: float | None) -> list[dict[str, Any]]:
    """``compare``'s rows with each plan's cost fields (a row with its own global batch uses it)."""
    return [{**r, **step_cost(r.get("iteration_s"), r.get("global_batch") or global_batch, usd_per_hour)} for r in rows]

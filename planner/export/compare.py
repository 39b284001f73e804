"""Score an exported plan beside hetplan's own, by the same simulator on the same inputs.

    rows = export_rows(plan, exported, profile, cluster, name="DeepSpeed export")
    console.print(compare_table(rows))      # hetplan.views.plan: the table ``hetplan compare`` prints

The rows have ``hetplan compare``'s shape (``name``, ``iteration_s``, ``speedup`` = the other's time
over hetplan's), so the same table prints them; an exported plan that does not fit in memory has
no time, as a baseline that does not fit. Bands of trust (``band``) are the views' to add: this
layer does not read the profile's sources (docs/architecture.md).
"""

from __future__ import annotations

from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.simulate import simulate

__all__ = ["export_rows"]


def export_rows(
    plan: Plan, exported: Plan, profile: ModelProfile, cluster: Cluster, *, name: str
) -> list[dict[str, Any]]:
    """hetplan's plan and the exported one, each simulated; the exported row is ``name``."""
    ours = simulate(plan, profile, cluster)
    theirs = simulate(exported, profile, cluster)
    fits = all(d.memory.fits for d in theirs.devices.values())
    return [
        {"name": "hetplan", "iteration_s": ours.iteration_s, "speedup": 1.0},
        {
            "name": name,
            "iteration_s": theirs.iteration_s if fits else None,
            "speedup": theirs.iteration_s / ours.iteration_s if fits else None,
        },
    ]

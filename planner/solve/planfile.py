"""Turn a search result into the plan file: inputs with their sha256, predictions, baselines, details.

Everything written is a function of the inputs (no timings, no dates), so the same inputs give the
same bytes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.plan import Plan
from hetplan.contracts.yamlio import sha256_of
from hetplan.solve.search import PlanResult, plan_details

__all__ = ["baseline_section", "finalize_plan"]


def _relative(path: Path, folder: Path) -> str:
    return Path(os.path.relpath(path.resolve(), folder.resolve())).as_posix()


def baseline_section(result: PlanResult) -> dict[str, Any]:
    out: dict[str, Any] = {}
    best = result.sim.iteration_s
    for name, candidate in result.baselines.items():
        if candidate is None or candidate.sim is None:
            out[name] = {"fits": False}
        else:
            t = candidate.sim.iteration_s
            out[name] = {
                "iteration_s": round(t, 9),
                "samples_per_s": round(candidate.sim.samples_per_s, 6),
                "plan_speedup": round(t / best, 6),
            }
    return out


def finalize_plan(
    result: PlanResult,
    *,
    profile_path: str | Path,
    cluster_path: str | Path,
    output: str | Path,
    cluster: Cluster,
    dtype: str,
) -> Plan:
    """The plan as it is written to ``output`` (paths relative to its folder)."""
    folder = Path(output).parent
    plan = result.plan
    plan.inputs = {
        "profile": {"path": _relative(Path(profile_path), folder), "sha256": sha256_of(profile_path)},
        "cluster": {"path": _relative(Path(cluster_path), folder), "sha256": sha256_of(cluster_path)},
    }
    plan.dtype = dtype
    plan.predicted = result.sim.predicted()
    plan.baselines = baseline_section(result)
    plan.details = plan_details(result, cluster)
    plan.file = str(output)
    return plan

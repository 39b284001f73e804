"""A what-if result as plain values: the table rows, the marginals, the Pareto front, the files.

    summary = what_if_summary(result, tokens_per_sample=1024)   # what summary.json holds
    write_what_if(result, summary, profile_path=..., output="what-if/")  # chosen plan + cluster

The views render the summary mapping (views do not import the planner), and ``summary.json`` is the
same mapping, so what the table shows and what a script reads agree.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hetplan.contracts.yamlio import write_yaml
from hetplan.solve.planfile import finalize_plan
from hetplan.solve.whatif import Evaluated, WhatIfResult

__all__ = ["pareto_front", "what_if_summary", "write_what_if"]


def _row(result: WhatIfResult, ev: Evaluated, run_samples: int | None) -> dict[str, Any]:
    space = result.space
    batch = result.global_batch
    t = ev.iteration_s
    step = ev.usd_per_step
    changes = []
    for k, c in zip(space.kinds, ev.counts, strict=True):
        if c != k.base:
            changes.append(f"{'+' if c > k.base else ''}{c - k.base} {k.name}")
    row: dict[str, Any] = {
        "counts": {k.name: c for k, c in zip(space.kinds, ev.counts, strict=True)},
        "change": ", ".join(changes) or "as is",
        "devices": ev.devices,
        "used_devices": ev.used_devices,
        "bound_s": round(ev.bound_s, 9),
        "usd_per_hour": ev.price_per_hour,
    }
    if ev.result is None:
        row["no_plan"] = ev.reason
        return row
    row.update(
        {
            "plan": ev.result.label,
            "iteration_s": round(t, 9),
            "samples_per_s": round(batch / t, 6),
            "usd_per_step": None if step is None else round(step, 9),
            "usd_per_sample": None if step is None else round(step / batch, 12),
        }
    )
    if run_samples is not None:
        steps = math.ceil(run_samples / batch)
        row["run_hours"] = round(steps * t / 3600.0, 6)
        row["usd_per_run"] = None if step is None else round(steps * step, 9)
    return row


def pareto_front(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The planned candidates no other beats on both iteration time and $/step, fastest first."""
    priced = sorted(
        (r for r in rows if r.get("usd_per_step") is not None),
        key=lambda r: (r["iteration_s"], r["usd_per_step"], r["devices"]),
    )
    front: list[dict[str, Any]] = []
    for r in priced:
        if not front or r["usd_per_step"] < front[-1]["usd_per_step"]:
            front.append(r)
    return front


def what_if_summary(result: WhatIfResult, *, run_samples: int | None = None) -> dict[str, Any]:
    """Everything the table, the picture and ``summary.json`` show, as plain values."""
    obj = result.objective
    rows = [_row(result, ev, run_samples) for ev in result.evaluated.values()]
    rows.sort(key=lambda r: (r.get("iteration_s", math.inf), r["devices"], json.dumps(r["counts"])))
    chosen = _row(result, result.chosen, run_samples) if result.chosen is not None else None
    for r in rows:
        r["chosen"] = chosen is not None and r["counts"] == chosen["counts"]
    marginals = []
    for m in result.marginals:
        ev = m["evaluated"]
        base = result.chosen
        entry: dict[str, Any] = {"kind": m["kind"], "nodes": m["delta"]}
        if ev.result is None:
            entry["no_plan"] = ev.reason
        else:
            entry["iteration_s"] = round(ev.iteration_s, 9)
            # against the chosen candidate's own plan: planned as the neighbour was (not in full)
            entry["speedup"] = round(base.compared_s / ev.iteration_s, 6)
            if ev.price_per_hour is not None and base.price_per_hour is not None:
                entry["usd_per_hour"] = round(ev.price_per_hour - base.price_per_hour, 9)
                base_step = base.price_per_hour * base.compared_s / 3600.0
                entry["usd_per_step"] = round(ev.usd_per_step - base_step, 9)
        marginals.append(entry)
    return {
        "objective": obj.name,
        "max_iteration_s": obj.max_iteration_s,
        "budget_per_hour": obj.budget_per_hour,
        "run_samples": run_samples,
        "global_batch": result.global_batch,
        "kinds": [
            {
                "name": k.name,
                "devices": dict(k.devices),
                "usd_per_hour": k.price_per_hour,
                "available": k.hi,
                "in_cluster": k.base,
                "pool": k.pool,
                "counts_tried": list(lv),
            }
            for k, lv in zip(result.space.kinds, result.space.levels, strict=True)
        ],
        "candidates": result.candidates,
        "planned": len(result.evaluated),
        "pruned": result.pruned,
        "exact": result.exact,
        "gap": result.gap,
        "chosen": chosen,
        "rows": rows,
        "pareto": [r["counts"] for r in pareto_front(rows)],
        "marginals": marginals,
        "notes": list(result.notes),
    }


def write_what_if(
    result: WhatIfResult,
    summary: dict[str, Any],
    *,
    profile_path: str | Path,
    output: str | Path,
    dtype: str,
) -> dict[str, Path]:
    """``output/cluster.yaml`` (the chosen cluster), ``output/plan.yaml`` (its plan, as ``hetplan
    plan`` writes it for that cluster) and ``output/summary.json``; returns the paths written."""
    folder = Path(output)
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    summary_path = folder / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    written["summary"] = summary_path
    chosen = result.chosen
    if chosen is None or chosen.result is None:
        return written
    cluster_path = folder / "cluster.yaml"
    write_yaml(result.space.cluster_data(chosen.counts), cluster_path)
    plan_path = folder / "plan.yaml"
    plan = finalize_plan(
        chosen.result,
        profile_path=profile_path,
        cluster_path=cluster_path,
        output=plan_path,
        cluster=chosen.cluster,
        dtype=dtype,
    )
    plan.save(plan_path)
    written["cluster"] = cluster_path
    written["plan"] = plan_path
    return written

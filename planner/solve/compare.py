"""A plan beside the baselines and any other plans, all scored by the same simulator.

    rows = compare_rows(plan, profile, cluster, others={"megatron": exported})
    rows[0]    # {"name": "hetplan", "iteration_s": ..., "speedup": 1.0}

The rows are data; :func:`hetplan.views.plan.compare_table` renders them (and adds each row's band).
Baselines come from the plan file when it recorded them (what ``hetplan plan`` found), else they
are computed now on the same inputs.
"""

from __future__ import annotations

from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import SYNC_MODES, SYNC_OPTIONS, Plan, load_plan_inputs, parse_plan
from hetplan.errors import HetplanError
from hetplan.simulate import simulate
from hetplan.simulate.simulator import SimResult
from hetplan.solve.baselines import baseline_plans
from hetplan.solve.search import PlanOptions
from hetplan.solve.ties import degrees_the_runtime_runs

__all__ = ["compare_rows", "over_memory", "same_inputs", "sync_mode_rows"]


def over_memory(result: SimResult) -> dict[str, float]:
    """Bytes by which each device that does not fit is over its capacity (peak - capacity)."""
    return {a: d.memory.total - d.memory.capacity for a, d in result.devices.items() if not d.memory.fits}


def compare_rows(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    *,
    others: dict[str, Plan] | None = None,
    ignore_memory: bool = False,
) -> list[dict[str, Any]]:
    """``hetplan`` (the plan re-simulated), every baseline, then each of ``others`` (name -> plan);
    ``speedup`` is a row's iteration over the plan's (above 1: the plan is faster), None where a row
    does not fit in memory. A plan of ``others`` with another global batch is compared per sample
    (its iteration over its batch against the plan's: iteration times of different batches say
    nothing about which trains faster); its row says so with ``per_sample`` and ``global_batch``.

    ``ignore_memory``: the plan and each of ``others`` are timed even where the memory check refuses
    them, and their rows carry ``over``: bytes over capacity per device that does not fit (empty
    where all fit). Baselines stay as the planner found them (one that does not fit has no plan)."""
    sim = simulate(plan, profile, cluster)
    rows: list[dict[str, Any]] = [{"name": "hetplan", "iteration_s": sim.iteration_s, "speedup": 1.0}]
    if ignore_memory:
        rows[0]["over"] = over_memory(sim)

    def add(name: str, seconds: float | None) -> None:
        rows.append(
            {"name": name, "iteration_s": seconds, "speedup": None if seconds is None else seconds / sim.iteration_s}
        )

    if plan.baselines:
        for name, recorded in plan.baselines.items():
            add(name, None if recorded.get("fits", True) is False else recorded["iteration_s"])
    else:
        opts = PlanOptions(global_batch=plan.global_batch, schedule=plan.schedule, optimizer=plan.optimizer)
        for name, candidate in baseline_plans(degrees_the_runtime_runs(profile), cluster, opts, plan).items():
            add(name, None if candidate is None else candidate.sim.iteration_s)
    for name, other in (others or {}).items():
        result = simulate(other, profile, cluster)
        fits = ignore_memory or all(d.memory.fits for d in result.devices.values())
        add(name, result.iteration_s if fits else None)
        if ignore_memory:
            rows[-1]["over"] = over_memory(result)
        if other.global_batch != plan.global_batch:
            row = rows[-1]
            row.update(per_sample=True, global_batch=other.global_batch)
            if fits:
                row["speedup"] = (result.iteration_s / other.global_batch) / (sim.iteration_s / plan.global_batch)
    return rows


def same_inputs(other: Plan, plan: Plan) -> Plan:
    """``other``, checked to be a plan of ``plan``'s profile and cluster (the same files, by sha256):
    a comparison of plans made for different inputs would be silently meaningless."""
    load_plan_inputs(other)  # its own inputs exist and are unchanged
    for key in ("profile", "cluster"):
        mine, theirs = plan.inputs.get(key, {}).get("sha256"), other.inputs.get(key, {}).get("sha256")
        if mine and theirs and mine != theirs:
            raise HetplanError(
                f"this plan was made for another {key} than {plan.file or 'the plan compared'} (sha256 differs)",
                file=other.file,
                field=f"inputs.{key}.sha256",
            )
    return other


def sync_mode_rows(
    plan: Plan, profile: ModelProfile, cluster: Cluster, *, options: dict[str, float | int] | None = None
) -> list[dict[str, Any]]:
    """The plan's pipelines, cuts and shares under every sync mode, by the same simulator: one row
    per mode with its options (the plan's own for its mode; otherwise the defaults, with any of
    ``options`` that the mode takes), the simulated iteration and samples/s, and ``speedup`` against
    the plan's own mode (above 1: that mode is faster per step). A mode that cannot run this plan
    (ZeRO-1 or tensor parallelism for adasum/wsp/sdpipe, differently shaped pipelines for sdpipe)
    gets its one-line reason instead. Per step only: how many steps each mode needs to reach a loss
    is statistical efficiency, which no simulator knows (docs/cost-model.md)."""
    known = {k for mode_options in SYNC_OPTIONS.values() for k in mode_options}
    for key in options or {}:
        if key not in known:
            raise HetplanError(
                f"no sync mode takes {key!r}; options are {', '.join(sorted(known))}", field="--sync-option"
            )
    own = simulate(plan, profile, cluster).iteration_s
    data = plan.to_dict()
    data.setdefault("inputs", {"profile": {"path": "-"}, "cluster": {"path": "-"}})
    rows: list[dict[str, Any]] = []
    for mode in SYNC_MODES:
        if mode == plan.sync:
            chosen = dict(plan.sync_options)
        else:
            chosen = {k: (options or {}).get(k, v) for k, v in SYNC_OPTIONS[mode].items()}
        row: dict[str, Any] = {"sync": mode, "options": chosen, "own": mode == plan.sync}
        try:
            moded = parse_plan({**data, "sync": mode, "sync_options": chosen}, file=plan.file)
            result = simulate(moded, profile, cluster)
        except HetplanError as exc:
            rows.append({**row, "iteration_s": None, "samples_per_s": None, "speedup": None, "why": exc.reason})
            continue
        fits = all(d.memory.fits for d in result.devices.values())
        seconds = result.iteration_s if fits else None
        rows.append(
            {
                **row,
                "iteration_s": seconds,
                "samples_per_s": None if seconds is None else plan.global_batch / seconds,
                "speedup": None if seconds is None else own / seconds,
                "why": None if fits else "does not fit in memory",
            }
        )
    return rows

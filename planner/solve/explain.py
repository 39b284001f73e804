"""Why each stage of a plan got its tensor-parallel degree and recomputation, and why ZeRO-1 is on
or off: the reasons ``hetplan show`` prints, written into the plan's ``details`` by the search.

    details = explain_plan(plan, tables, slot_costs, cluster, zero_alternative)
    details["stages"][0]["why"]
    # 'TP 2: degree 1 does not fit V100-16GB (needs 19.3 GiB of 14.9 GiB); TP 2 fits with 1.2 GiB
    #  headroom and is 8.0% faster than TP 4'

Each alternative is priced by the same :class:`~hetplan.solve.tables.CostTables` the partition DP
used (time per micro-batch of one replica, memory of one device with the stage's micro-batches in
flight), so the text says what the search weighed. Stages that read the same (same device type,
blocks, options, micro-batch and position) are explained once, with every pipeline they occur in.
"""

from __future__ import annotations

from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.plan import RECOMPUTE, Plan, Stage, split_micro_batch
from hetplan.solve.partition import Slot, SlotCosts, in_flight
from hetplan.solve.tables import CostTables
from hetplan.units import format_bytes

__all__ = ["explain_plan", "explain_zero"]


def _holders(plan: Plan, block: int) -> int:
    """Replicas holding ``block`` across the plan (ZeRO-1 shards its optimizer state over them)."""
    return sum(len(s.replicas) for p in plan.pipelines for s in p.stages if s.start <= block < s.end)


def _priced(
    tables: CostTables,
    costs: SlotCosts,
    link,
    stage: Stage,
    device,
    m: int,
    held: int,
    holders: int,
    shared: bool,
    option,
) -> tuple[float, float]:
    """(seconds per micro-batch of the slowest replica, bytes on one device) of one option: the
    partition DP's prices (:class:`SlotCosts`), memory by :meth:`CostTables.stage_memory`."""
    tp, recompute = option
    replicas = len(stage.devices) // tp
    count = max(split_micro_batch(m, tuple(1.0 / replicas for _ in range(replicas))))
    prefix = costs.prefix(device.type.name, count, option, link)
    seconds = float(prefix[stage.end] - prefix[stage.start])
    need = tables.stage_memory(
        device.type,
        stage.start,
        stage.end,
        m=count,
        in_flight=held,
        tp=tp,
        recompute=recompute,
        zero_holders=holders,
        reduced=shared,
    )
    return seconds, need


def _percent(a: float, b: float) -> str:
    return f"{abs(a / b - 1):.1%}"


def _stage_reason(tables: CostTables, costs: SlotCosts, cluster: Cluster, plan: Plan, pi: int, si: int) -> str:
    p = plan.pipelines[pi]
    stage = p.stages[si]
    devices = tuple(cluster.device(a) for a in stage.devices)
    slot = Slot.of(devices)
    device = devices[0]
    cap = device.type.usable_tensor_bytes
    m = max(p.micro_batches)
    held = in_flight(plan.schedule, si, len(p.stages), len(p.micro_batches))
    all_holders = _holders(plan, stage.start)
    holders = all_holders if plan.zero else 1
    shared = all_holders > 1
    link = costs.tp_link(slot)
    # only the degrees every device type of the stage has times for (a profile may lack some)
    types = {d.type.name for d in devices}
    degrees = [t for t in slot.degrees() if all(t in tables.tp_options(stage.start, stage.end, n) for n in types)]
    priced = {
        (t, r): _priced(tables, costs, link, stage, device, m, held, holders, shared, (t, r))
        for t in degrees
        for r in RECOMPUTE
    }
    t0, r0 = stage.tensor_parallel, stage.recompute
    seconds0, need0 = priced.get((t0, r0)) or _priced(
        tables, costs, link, stage, device, m, held, holders, shared, (t0, r0)
    )
    room = f"{format_bytes(cap - need0)} headroom" if need0 <= cap else f"{format_bytes(need0 - cap)} over"
    parts: list[str] = []
    faster_than: list[str] = []
    for t in degrees:
        if t == t0:
            continue
        fitting = [(priced[(t, r)][0], r) for r in RECOMPUTE if priced[(t, r)][1] <= cap]
        if not fitting:
            least = min(priced[(t, r)][1] for r in RECOMPUTE)
            parts.append(
                f"degree {t} does not fit {device.type.name} (needs {format_bytes(least)} of {format_bytes(cap)}"
                + (", even with full recomputation)" if len(RECOMPUTE) > 1 else ")")
            )
            continue
        seconds, _ = min(fitting)
        if seconds >= seconds0:
            faster_than.append(f"{_percent(seconds0, seconds)} faster than TP {t}")
        else:
            parts.append(
                f"degree {t} would be {_percent(seconds, seconds0)} faster but every holder of a block uses one "
                "degree, and the other holders' choice wins overall"
            )
    if len(degrees) <= 1:
        lead = f"TP {t0}: the only degree {'the profile has for these blocks' if len(devices) > 1 else 'of one device'}"
    else:
        lead = f"TP {t0}: " + "; ".join(parts) + ("; " if parts else "") + f"fits with {room}"
        if faster_than:
            lead += " and is " + ", ".join(faster_than)
    if r0 == "none":
        tail = f"no recomputation (fits with {room})" if len(degrees) <= 1 else "no recomputation needed"
    else:
        cheaper = [
            f"{'no recomputation' if r == 'none' else r} needs {format_bytes(priced[(t0, r)][1])} "
            f"of {format_bytes(cap)}"
            for r in RECOMPUTE
            if (t0, r) in priced and r != r0 and priced[(t0, r)][0] < seconds0
        ]
        tail = f"recompute {r0}" + (f": {'; '.join(cheaper)}" if cheaper else "") + f" (fits with {room})"
    return f"{lead}; {tail}"


def explain_plan(
    plan: Plan, tables: CostTables, costs: SlotCosts, cluster: Cluster, zero_alternative: dict[str, Any] | None
) -> dict[str, Any]:
    """``{"stages": [...], "zero": {...}}`` for the plan's ``details`` (see the module docstring)."""
    seen: dict[tuple, dict[str, Any]] = {}
    for pi, p in enumerate(plan.pipelines):
        for si, s in enumerate(p.stages):
            kind = cluster.device(s.devices[0]).type.name
            key = (kind, len(s.devices), s.start, s.end, s.tensor_parallel, s.recompute, max(p.micro_batches), si)
            key += (len(p.stages), len(p.micro_batches))
            if key in seen:
                seen[key]["pipelines"].append(pi)
                continue
            seen[key] = {
                "pipelines": [pi],
                "stage": si,
                "tensor_parallel": s.tensor_parallel,
                "recompute": s.recompute,
                "why": _stage_reason(tables, costs, cluster, plan, pi, si),
            }
    return {"stages": list(seen.values()), "zero": explain_zero(plan, zero_alternative)}


def explain_zero(plan: Plan, alternative: dict[str, Any] | None) -> dict[str, Any]:
    """Why ZeRO-1 is on or off, from the same plan simulated the other way (``alternative``: its
    ``fits``, ``iteration_s`` or the device that overflows; None where no block has two holders)."""
    if alternative is None:
        return {"zero": plan.zero, "why": "ZeRO-1 off: every block has one holder, there is nothing to shard"}
    if alternative.get("tied"):
        return {
            "zero": plan.zero,
            "why": f"ZeRO-1 off: the model ties parameters ({alternative['tied']}), which ZeRO-1 does not support yet",
        }
    if alternative.get("tight") is False:
        return {
            "zero": plan.zero,
            "why": "ZeRO-1 off: memory is not tight (every stage got its fastest option without it)",
        }
    mine = plan.predicted.get("iteration_s") if plan.predicted else None
    mine = alternative.get("this_iteration_s", mine)
    if plan.zero:
        if not alternative["fits"]:
            why = (
                f"ZeRO-1 on: without it {alternative['device']} needs {format_bytes(alternative['needs'])} "
                f"of {format_bytes(alternative['capacity'])}"
            )
        else:
            why = f"ZeRO-1 on: without it the plan is {_percent(alternative['iteration_s'], mine)} slower"
    elif not alternative["fits"]:
        why = "ZeRO-1 off: the plan fits without it (with it, it would not: the simulator's memory walk)"
    elif alternative["iteration_s"] >= mine * (1 - 1e-9):
        same = abs(alternative["iteration_s"] / mine - 1) < 1e-6
        why = (
            "ZeRO-1 off: the plan fits without it and ZeRO-1 is no faster (off preferred when equal)"
            if same
            else "ZeRO-1 off: the plan fits without it, and with it the plan is "
            f"{_percent(alternative['iteration_s'], mine)} slower"
        )
    else:
        why = "ZeRO-1 off: the search found the faster plans without it"
    return {"zero": plan.zero, "why": why}

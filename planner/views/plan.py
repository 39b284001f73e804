"""What ``hetplan plan``, ``show`` and ``compare`` print about a plan."""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from planner.contracts.cluster import Cluster
from planner.contracts.model_profile import ModelProfile
from planner.contracts.plan import Plan
from planner.units import format_bytes, format_time

__all__ = ["compare_rows", "compare_table", "plan_summary_renderables"]


def plan_summary_renderables(plan: Plan, cluster: Cluster) -> list[Any]:
    """Stages and devices, memory headroom, bottleneck, lower bound, runners-up, baselines."""
    predicted = plan.predicted or {}
    memory = predicted.get("memory", {})
    table = Table(
        title=f"Plan: global batch {plan.global_batch}, {plan.schedule}, {plan.optimizer}, "
        f"{len(plan.pipelines)} pipeline(s) on {cluster.name}",
        title_justify="left",
    )
    for col in ("pipe", "batch", "micro-batches", "stage", "blocks", "devices", "headroom"):
        table.add_column(col)
    for pi, p in enumerate(plan.pipelines):
        for si, s in enumerate(p.stages):
            names = []
            rooms = []
            for d, share in zip(s.devices, s.shares, strict=True):
                dev = cluster.device(d)
                label = f"{d} {dev.type.name}" + (f" ({share:.0%})" if s.replicated else "")
                names.append(label)
                mem = memory.get(d)
                if mem:
                    room = mem["capacity_bytes"] - mem["peak_bytes"]
                    rooms.append(Text(format_bytes(room), style="green" if room >= 0 else "bold red"))
            head = si == 0
            table.add_row(
                str(pi) if head else "",
                str(p.batch) if head else "",
                " ".join(map(str, p.micro_batches)) if head else "",
                str(si),
                f"[{s.start}, {s.end})",
                "\n".join(names),
                Text("\n").join(rooms) if rooms else "",
            )
    out: list[Any] = [table]
    if any(cluster.device(a).type.emulated for a in plan.all_devices()):
        out.append(Text("device speeds are EMULATED on this machine (slowdown factors)", style="bold yellow"))
    if predicted:
        line = Text()
        line.append(f"predicted iteration {format_time(predicted['iteration_s'])}", style="bold")
        line.append(f", {predicted['samples_per_s']:,.1f} samples/s, bubble {predicted['bubble_fraction']:.1%}, ")
        line.append(f"bottleneck: {predicted.get('bottleneck', '?')}", style="bold red")
        out.append(line)
    details = plan.details or {}
    if "lower_bound_s" in details:
        out.append(
            Text(
                f"lower bound {format_time(details['lower_bound_s'])} (each block on its best device type, "
                f"every device busy, no communication): the plan is {details['gap_to_lower_bound']:.1%} above it"
            )
        )
    if details.get("idle_devices"):
        out.append(
            Text(f"left idle (they would slow the iteration): {', '.join(details['idle_devices'])}", style="yellow")
        )
    if details.get("runners_up"):
        runners = Table(title="Runners-up (why they lost)", title_justify="left")
        for col in ("structure", "iteration", "slower by", "their bottleneck"):
            runners.add_column(col)
        for r in details["runners_up"]:
            runners.add_row(r["structure"], format_time(r["iteration_s"]), f"{r['slower_by']:.1%}", r["bottleneck"])
        out.append(runners)
    if plan.baselines:
        out.append(compare_table(_rows_from_file(plan)))
    return out


def _rows_from_file(plan: Plan) -> list[dict[str, Any]]:
    rows = [{"name": "hetplan", "iteration_s": plan.predicted.get("iteration_s"), "speedup": 1.0}]
    for name, b in plan.baselines.items():
        if b.get("fits", True) is False:
            rows.append({"name": name, "iteration_s": None, "speedup": None})
        else:
            rows.append({"name": name, "iteration_s": b["iteration_s"], "speedup": b["plan_speedup"]})
    return rows


def compare_rows(plan: Plan, profile: ModelProfile, cluster: Cluster) -> list[dict[str, Any]]:
    """The plan re-simulated, beside every baseline (from the plan file, or computed now)."""
    from planner.simulate import simulate

    sim = simulate(plan, profile, cluster)
    rows = [{"name": "hetplan", "iteration_s": sim.iteration_s, "speedup": 1.0}]
    if plan.baselines:
        for row in _rows_from_file(plan)[1:]:
            if row["iteration_s"] is not None:
                row["speedup"] = row["iteration_s"] / sim.iteration_s
            rows.append(row)
        return rows
    from planner.solve.baselines import baseline_plans
    from planner.solve.search import PlanOptions

    opts = PlanOptions(global_batch=plan.global_batch, schedule=plan.schedule, optimizer=plan.optimizer)
    for name, candidate in baseline_plans(profile, cluster, opts, plan).items():
        if candidate is None:
            rows.append({"name": name, "iteration_s": None, "speedup": None})
        else:
            t = candidate.sim.iteration_s
            rows.append({"name": name, "iteration_s": t, "speedup": t / sim.iteration_s})
    return rows


def compare_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="Plan vs baselines (same inputs, same simulator)", title_justify="left")
    table.add_column("plan")
    table.add_column("iteration", justify="right")
    table.add_column("hetplan is faster by", justify="right")
    for r in rows:
        if r["iteration_s"] is None:
            table.add_row(r["name"], "does not fit", "-")
        else:
            table.add_row(
                r["name"], format_time(r["iteration_s"]), "-" if r["name"] == "hetplan" else f"{r['speedup']:.2f}x"
            )
    return table

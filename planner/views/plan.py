"""What ``hetplan plan``, ``show`` and ``compare`` print about a plan.

Every predicted iteration time is printed with its band (:mod:`hetplan.profile.trust`): how far the
real time may lie from it, given where the profile's times came from, e.g.
``1.23 s (estimated times: x0.79 to x1.39, docs/estimates.md)``.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.errors import HetplanError
from hetplan.profile.trust import Band, time_band
from hetplan.units import format_bytes, format_time
from hetplan.views.simulation import central_line
from hetplan.views.whatif import usd

__all__ = ["compare_table", "micro_batch_runs", "plan_band", "plan_summary_renderables", "sync_table", "with_bands"]


def plan_band(plan: Plan, profile: ModelProfile, cluster: Cluster) -> Band:
    """The band of the plan's predicted times: from the profile's times on the types it uses."""
    return time_band(profile, [cluster.device(a).type for a in plan.all_devices()])


def _band(band: dict[str, Any]) -> Band:
    return Band(low=band["low"], high=band["high"], sources=tuple(band["sources"]), reference=band["reference"])


def _with_band(seconds: float, band: dict[str, Any] | None) -> str:
    """``1.23 s (estimated times: x0.79 to x1.39, docs/estimates.md)``, or the bare time without a band."""
    if not band:
        return format_time(seconds)
    return f"{format_time(seconds)} ({_band(band).label()})"


def plan_summary_renderables(plan: Plan, cluster: Cluster, profile: ModelProfile | None = None) -> list[Any]:
    """Stages and devices, memory headroom, bottleneck, lower bound, runners-up, baselines.

    ``profile`` gives the band of the predicted time (without it, the time is printed bare): views
    render what they are given and read no file.
    """
    predicted = plan.predicted or {}
    band = None
    if profile is not None:
        try:
            band = plan_band(plan, profile, cluster).to_dict()
        except HetplanError:
            band = None  # the profile lacks a type the plan uses: check_plan says so elsewhere
    memory = predicted.get("memory", {})
    table = Table(
        title=f"Plan: global batch {plan.global_batch}, {plan.schedule}, {plan.optimizer}, "
        f"{len(plan.pipelines)} pipeline(s) on {cluster.name}",
        title_justify="left",
    )
    for col in ("pipe", "batch", "micro-batches", "stage", "blocks", "devices", "headroom"):
        table.add_column(col)
    rows = [_pipeline_rows(p, cluster, memory) for p in plan.pipelines]
    shapes = [(p.batch, p.micro_batches, tuple(r[2] for r in rows[i])) for i, p in enumerate(plan.pipelines)]
    for first, last in _alike_runs(shapes):
        p = plan.pipelines[first]
        for si, (s, (names, rooms, _)) in enumerate(zip(p.stages, rows[first], strict=True)):
            head = si == 0
            table.add_row(
                str(first) if head else "",
                str(p.batch) if head else "",
                micro_batch_runs(p.micro_batches) if head else "",
                str(si),
                f"[{s.start}, {s.end})" + _options(s),
                "\n".join(names),
                Text("\n").join(rooms) if rooms else "",
            )
        if last > first:
            others = [a for p in plan.pipelines[first + 1 : last + 1] for s in p.stages for a in s.devices]
            nodes = list(dict.fromkeys(cluster.device(a).node for a in others))
            where = nodes[0] if len(nodes) == 1 else f"{nodes[0]} to {nodes[-1]}"
            table.add_row(
                f"{first + 1}-{last}",
                str(p.batch),
                micro_batch_runs(p.micro_batches),
                "all",
                f"as pipe {first}",
                f"{len(others)} devices on {len(nodes)} node(s), {where}",
                "as pipe " + str(first) if rows[first][0][1] else "",
            )
    out: list[Any] = [table]
    if any(cluster.device(a).type.emulated for a in plan.all_devices()):
        out.append(Text("device speeds are EMULATED on this machine (slowdown factors)", style="bold yellow"))
    if predicted:
        line = Text()
        line.append(f"predicted iteration {_with_band(predicted['iteration_s'], band)}", style="bold")
        line.append(f", {predicted['samples_per_s']:,.1f} samples/s, bubble {predicted['bubble_fraction']:.1%}, ")
        line.append(f"bottleneck: {predicted.get('bottleneck', '?')}", style="bold red")
        out.append(line)
        if cluster.price_per_hour is not None:
            out.append(Text(cost_line(predicted["iteration_s"], plan.global_batch, cluster.price_per_hour)))
        line = central_line(predicted.get("central"))
        if line:
            out.append(Text(line))
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
            # Text: a label such as ``2 x [cpu-slow]`` is not rich markup (it printed as ``2 x ``)
            runners.add_row(
                Text(r["structure"]), format_time(r["iteration_s"]), f"{r['slower_by']:.1%}", Text(r["bottleneck"])
            )
        out.append(runners)
    out.extend(_why_options(details))
    if plan.baselines:
        out.append(compare_table(_rows_from_file(plan, band)))
    return out


#: Pipelines alike in a row (same batch, micro-batches, stages, device types, shares and headroom)
#: from which the plan table prints the first whole and the rest as one row: a 512-device plan of
#: 200 pipelines printed 512 device rows.
FOLD_ALIKE = 3


def _pipeline_rows(p: Pipeline, cluster: Cluster, memory: dict) -> list[tuple[list[str], list[Text], tuple]]:
    """Per stage: the devices column's lines, the headroom column's, and what the stage is apart
    from which devices run it (its blocks, options, each member's type, share and headroom)."""
    out = []
    for s in p.stages:
        names, rooms, alike = [], [], []
        for d in s.devices:
            dev = cluster.device(d)
            share = f" ({s.share_of(d):.0%})" if s.replicated else ""
            names.append(f"{d} {dev.type.name}{share}")
            mem = memory.get(d)
            room = None
            if mem:
                room = mem["capacity_bytes"] - mem["peak_bytes"]
                rooms.append(Text(format_bytes(room), style="green" if room >= 0 else "bold red"))
            alike.append(
                (dev.type.name, share, format_bytes(room) if room is not None else None, room is None or room >= 0)
            )
        out.append((names, rooms, (s.start, s.end, _options(s), tuple(alike))))
    return out


def _alike_runs(shapes: list[tuple]) -> list[tuple[int, int]]:
    """(first, last) pipeline of each run of equal ``shapes`` in order, runs shorter than
    :data:`FOLD_ALIKE` split into single pipelines."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(shapes):
        j = i
        while j + 1 < len(shapes) and shapes[j + 1] == shapes[i]:
            j += 1
        runs.extend([(i, j)] if j - i + 1 >= FOLD_ALIKE else [(k, k) for k in range(i, j + 1)])
        i = j + 1
    return runs


def micro_batch_runs(sizes: tuple[int, ...] | list[int]) -> str:
    """``16 127x32``: micro-batch sizes in order, a run of three or more equal sizes folded as
    ``countxsize`` (a 4096-sample pipeline printed 128 numbers); shorter runs spelled out (``3 4 4``)."""
    out: list[str] = []
    i = 0
    while i < len(sizes):
        j = i
        while j < len(sizes) and sizes[j] == sizes[i]:
            j += 1
        out.extend([f"{j - i}x{sizes[i]}"] if j - i >= 3 else [str(sizes[i])] * (j - i))
        i = j
    return " ".join(out)


def _options(stage: Stage) -> str:
    """`` TP 2, recompute full``: what a stage runs beyond its blocks (empty for the defaults)."""
    parts = [f"TP {stage.tensor_parallel}"] if stage.tensor_parallel > 1 else []
    if stage.recompute != "none":
        parts.append(f"recompute {stage.recompute}")
    return ("\n" + ", ".join(parts)) if parts else ""


def _why_options(details: dict[str, Any]) -> list[Any]:
    """The search's reasons for each stage's TP degree and recomputation and for the ZeRO choice,
    as it recorded them in ``details`` (nothing is searched again here)."""
    out: list[Any] = []
    stages = details.get("stages") or []
    if stages:
        table = Table(title="Why each stage runs as it does (from the search)", title_justify="left")
        for col in ("pipelines", "stage", "TP", "recompute", "why"):
            table.add_column(col)
        for e in stages:
            table.add_row(
                _pipelines(e.get("pipelines", [])),
                str(e.get("stage", "")),
                str(e.get("tensor_parallel", 1)),
                str(e.get("recompute", "none")),
                str(e.get("why", "")),
            )
        out.append(table)
    zero = details.get("zero")
    if isinstance(zero, dict) and zero.get("why"):
        out.append(Text(str(zero["why"])))
    return out


def _pipelines(indices: list[int]) -> str:
    """``0-3, 7``: pipeline indices with runs folded."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _rows_from_file(plan: Plan, band: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The baselines a plan file recorded, as compare rows (no computation: what the file says)."""
    rows: list[dict[str, Any]] = [{"name": "hetplan", "iteration_s": plan.predicted.get("iteration_s"), "speedup": 1.0}]
    if band is not None:
        rows[0]["band"] = band
    for name, b in plan.baselines.items():
        if b.get("fits", True) is False:
            rows.append({"name": name, "iteration_s": None, "speedup": None})
        else:
            rows.append({"name": name, "iteration_s": b["iteration_s"], "speedup": b["plan_speedup"]})
    return rows


def with_bands(rows: list[dict[str, Any]], plan: Plan, profile: ModelProfile, cluster: Cluster) -> list[dict[str, Any]]:
    """Each compare row with the band its iteration time carries: hetplan's plan over the types it
    uses; the others (baselines, exports) may use any device of the cluster, so over every type."""
    ours = plan_band(plan, profile, cluster).to_dict()
    everyone = time_band(profile, [d.type for d in cluster.devices]).to_dict()
    return [{**r, "band": ours if r["name"] == "hetplan" else everyone} for r in rows]


def sync_table(rows: list[dict[str, Any]]) -> Table:
    """One row per sync mode (:func:`hetplan.solve.compare.sync_mode_rows`): the same pipelines under
    each, per step; the caption says what a step time cannot tell."""
    table = Table(title="The plan under each sync mode (same pipelines, same simulator)", title_justify="left")
    for name, justify in [("sync", "left"), ("options", "left"), ("iteration", "right")]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    table.add_column("samples/s", justify="right")
    table.add_column("vs the plan's mode", justify="right")
    for r in rows:
        options = ", ".join(f"{k} {v}" for k, v in r["options"].items()) or "-"
        name = f"{r['sync']} (the plan's)" if r["own"] else r["sync"]
        if r["iteration_s"] is None:
            table.add_row(name, options, Text(r["why"], style="yellow"), "-", "-")
        else:
            speed = "-" if r["own"] else f"{r['speedup']:.2f}x"
            table.add_row(name, options, format_time(r["iteration_s"]), f"{r['samples_per_s']:,.1f}", speed)
    table.caption = (
        "per step only: stale (wsp, sdpipe) or sparsified (topk) updates may need more steps to reach "
        "a loss, which no simulator knows (docs/cost-model.md, docs/sync-modes.md)"
    )
    return table


def compare_table(
    rows: list[dict[str, Any]], *, usd_per_hour: float | None = None, global_batch: int | None = None
) -> Table:
    """One row per plan; the hetplan row's iteration time carries its band (baselines share the
    profile, so theirs is the same or, over every type of the cluster, the envelope in the caption).
    With the cluster's ``usd_per_hour`` (every node priced), $/step and $/sample columns: every
    plan here runs on that cluster, so it pays for all of it."""
    table = Table(title="Plan vs baselines (same inputs, same simulator)", title_justify="left")
    table.add_column("plan")
    table.add_column("iteration", justify="right")
    table.add_column("hetplan is faster by", justify="right")
    priced = usd_per_hour is not None and global_batch is not None
    if priced:
        table.add_column("$/step", justify="right")
        table.add_column("$/sample", justify="right")
    notes: list[str] = []
    for r in rows:
        cost = []
        if priced:
            step = None if r["iteration_s"] is None else usd_per_hour * r["iteration_s"] / 3600.0
            cost = ["-", "-"] if step is None else [usd(step), usd(step / r.get("global_batch", global_batch))]
        if r["iteration_s"] is None:
            table.add_row(r["name"], "does not fit", "-", *cost)
        else:
            ours = r["name"] == "hetplan"
            shown = _with_band(r["iteration_s"], r.get("band")) if ours else format_time(r["iteration_s"])
            speed = "-" if ours else f"{r['speedup']:.2f}x"
            if r.get("per_sample"):
                shown += f" (batch {r['global_batch']})"
                speed += " per sample"
            table.add_row(r["name"], shown, speed, *cost)
        if r.get("per_sample"):
            notes.append(
                f"{r['name']} has global batch {r['global_batch']}: compared per sample (iteration / global batch)"
            )
    others = [r.get("band") for r in rows if r["name"] != "hetplan" and r.get("band")]
    if others and others[0] != next((r.get("band") for r in rows if r["name"] == "hetplan"), None):
        notes.append(f"baselines, over every device type of the cluster: {_band(others[0]).label()}")
    if notes:
        table.caption = "\n".join(notes)
    return table


def cost_line(iteration_s: float, global_batch: int, usd_per_hour: float) -> str:
    """``cost: $52.32/h for the cluster: $0.0054/step, $1.1e-05/sample`` (every node is paid for,
    idle or not; prices from the catalog or the cluster file's ``price_per_hour``)."""
    step = usd_per_hour * iteration_s / 3600.0
    return (
        f"cost: {usd(usd_per_hour)}/h for the cluster: {usd(step)}/step, {usd(step / global_batch)}/sample "
        "(catalog prices or the cluster file's price_per_hour)"
    )

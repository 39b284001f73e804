"""Tables of jobs that share GPUs: a co-simulation, and a co-plan beside its alternatives.

Both render results computed elsewhere (:mod:`hetplan.simulate.together`, :mod:`hetplan.solve.coplan`);
the co-plan arrives as its summary mapping (what ``summary.yaml`` holds), since views do not import the
planner.
"""

from __future__ import annotations

from typing import Any

from rich.table import Table
from rich.text import Text

from hetplan.simulate.together import TogetherResult
from hetplan.units import format_bytes, format_time

__all__ = ["co_plan_renderables", "together_renderables"]


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def together_renderables(result: TogetherResult, *, emulated: bool = False) -> list[Any]:
    """Headline (combined vs one after the other), a row per job, the tightest shared memory."""
    head = Text()
    head.append(f"{result.policy} co-run: {result.combined_samples_per_s:,.1f} samples/s combined", style="bold")
    head.append(
        f"   one after the other {result.sequential_samples_per_s:,.1f} samples/s "
        f"({_ratio(result.combined_samples_per_s, result.sequential_samples_per_s)})"
    )
    out: list[Any] = [head]
    if emulated:
        out.append(Text("device speeds are EMULATED on this machine (slowdown factors)", style="bold yellow"))
    table = Table(title="Jobs (steady-state iterations)", title_justify="left")
    for col in ("job", "plan", "devices", "batch"):
        table.add_column(col)
    for col in ("one iteration", "alone", "together", "slowdown", "samples/s alone", "together", "held back"):
        table.add_column(col, justify="right")
    for j in result.jobs:
        table.add_row(
            j.label,
            j.file or "-",
            str(len(j.devices)),
            str(j.global_batch),
            format_time(j.iteration_s),
            format_time(j.solo_iteration_s),
            format_time(j.co_iteration_s),
            f"{j.slowdown:.2f}x",
            f"{j.solo_samples_per_s:,.1f}",
            f"{j.co_samples_per_s:,.1f}",
            format_time(j.wait_s),
        )
    out.append(table)
    measured = ", ".join(f"{j.label}: {j.measured:.1f} of {j.iterations}" for j in result.jobs)
    lo, hi = result.window
    out.append(
        Text(
            f"steady state: measured from {format_time(lo)} (every job past the first third of its iterations) to "
            f"{format_time(hi)} (the first job done): the mean period of a job's iteration ends there, or where it "
            f"ended fewer than 3 the window over the iterations' worth of compute it did ({measured} iterations); "
            "one iteration: hetplan simulate's; held back: compute waiting for a device busy with another job, per "
            "iteration, summed over the job's devices"
        )
    )
    if result.memory:
        address, (capacity, peaks) = max(result.memory.items(), key=lambda kv: (sum(kv[1][1]) / kv[1][0], kv[0]))
        out.append(
            Text(
                f"{len(result.shared_devices)} shared devices; fullest {address}: "
                f"{' + '.join(format_bytes(p) for p in peaks)} of {format_bytes(capacity)}"
            )
        )
    else:
        out.append(Text("no device is shared: the jobs meet only on the network"))
    return out


def co_plan_renderables(summary: dict[str, Any]) -> list[Any]:
    """The chosen co-schedule beside the jobs one after the other and side by side on split devices."""
    chosen = summary["chosen"]
    out: list[Any] = [
        Text(
            f"co-plan: {chosen['combined_samples_per_s']:,.1f} samples/s combined ({chosen['arrangement']}"
            + (f", {chosen['policy']}" if chosen.get("policy") else "")
            + "), "
            f"fairness: neither job slower than {summary['fairness']:g}x its solo plan",
            style="bold",
        )
    ]
    table = Table(title="Arrangements (steady-state iterations, same simulator)", title_justify="left")
    table.add_column("arrangement")
    for label in summary["jobs"]:
        table.add_column(f"{label}: devices")
        table.add_column(f"{label}: iteration", justify="right")
        table.add_column(f"{label}: slowdown", justify="right")
    table.add_column("samples/s", justify="right")
    table.add_column("vs one after the other", justify="right")
    sequential = summary["sequential"]["combined_samples_per_s"]
    for key, name in (("chosen", "co-plan"), ("sequential", "one after the other"), ("split", "split devices")):
        row = summary[key]
        if "jobs" not in row:  # a job does not fit on its half
            table.add_row(name, *(["-"] * (3 * len(summary["jobs"]))), "does not fit", "-")
            continue
        policy = f" ({row['policy']})" if row.get("policy") else ""
        cells = [name if key != "chosen" else f"co-plan: {row['arrangement']}{policy}"]
        for label in summary["jobs"]:
            job = row["jobs"][label]
            cells += [str(job["devices"]), format_time(job["iteration_s"]), f"{job['slowdown']:.2f}x"]
        cells += [f"{row['combined_samples_per_s']:,.1f}", _ratio(row["combined_samples_per_s"], sequential)]
        table.add_row(*cells)
    out.append(table)
    if chosen.get("runs"):  # a crossover co-schedule: a what-if the runtime does not run
        out.append(Text(f"policy {chosen['policy']}: {chosen['runs']}", style="yellow"))
    out.append(Text(f"slowdown: against each job's solo plan on the whole cluster; split: {summary['split']['rule']}"))
    searched = summary["search"]
    out.append(
        Text(
            f"searched {searched['pairs_simulated']} pairs of {searched['candidates']['A']} x "
            f"{searched['candidates']['B']} candidate plans ({searched['pairs_fitting']} fit in memory together)"
        )
    )
    return out

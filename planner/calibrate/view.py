"""What ``hetplan calibrate`` prints: the runs before and after, the parameters, the memory, and why.

print_all(console, calibration_renderables(result, written))
calibration_json(result, written)       # the same, as one JSON-able mapping
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from hetplan.calibrate.calibration import Calibration, ParamFit
from hetplan.calibrate.fit import NOISE, PRIOR_WIDTH, RESOLUTION
from hetplan.calibrate.inputs import WARMUP_STEPS
from hetplan.units import format_bandwidth, format_bytes, format_time

__all__ = ["calibration_json", "calibration_renderables"]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _value(p: ParamFit, value: float) -> str:
    if p.kind == "bandwidth":
        return format_bandwidth(value)
    if p.kind == "latency":
        return format_time(value) if value > 0 else "0"
    return f"{value:.4g}"


def _runs_table(result: Calibration) -> Table:
    table = Table(
        title="Runs: iteration time, measured vs simulated "
        f"(run logs: median over the steps after the first {WARMUP_STEPS})",
        title_justify="left",
    )
    for col in ("run", "measured", "predicted before", "predicted after", "residual", "leave-one-out error"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for r in result.runs:
        table.add_row(
            Text(r.name + (f" ({r.steps} steps)" if r.steps else "")),
            format_time(r.measured),
            f"{format_time(r.before)} ({r.before / r.measured - 1:+.1%})",
            format_time(r.after),
            _pct(r.residual),
            _pct(r.loo_error),
        )
    return table


def _compute_table(result: Calibration) -> Table | None:
    rows = [(r.name, c) for r in result.runs for c in r.compute]
    if not rows:
        return None
    table = Table(title="Per-rank compute per step (run logs): measured vs simulated", title_justify="left")
    for col in ("run", "device", "type", "measured", "before", "after", "residual"):
        table.add_column(col, justify="left" if col in ("run", "device", "type") else "right")
    for name, c in rows:
        table.add_row(
            Text(name),
            Text(c.device),
            Text(c.type),
            format_time(c.measured),
            format_time(c.before),
            format_time(c.after),
            _pct(c.after / c.measured - 1),
        )
    return table


def _params_table(result: Calibration) -> Table:
    table = Table(title="Fitted parameters", title_justify="left")
    for col in ("parameter", "input", "calibrated", "factor", "status", "why"):
        table.add_column(col, justify="right" if col in ("input", "calibrated", "factor") else "left")
    for p in result.params:
        status = Text("identified", style="bold green") if p.identified else Text("prior", style="dim")
        factor = "-" if p.factor is None else f"x{p.factor:.4g}"
        table.add_row(Text(p.name), _value(p, p.prior), _value(p, p.value), factor, status, p.reason)
    for r in result.reserves:
        why = f"median of {len(r.points)} device peak(s)" + (", capped below memory" if r.capped else "")
        table.add_row(
            Text(f"reserve[{r.type}]"),
            format_bytes(r.before),
            format_bytes(r.reserve),
            "-",
            Text("identified", style="bold green"),
            why,
        )
    return table


def _memory_table(result: Calibration) -> Table | None:
    rows = [(p, r) for r in result.reserves for p in r.points]
    if not rows:
        return None
    table = Table(title="Process peak memory per device: measured vs predicted", title_justify="left")
    for col in ("run", "device", "measured", "predicted before", "predicted after", "residual"):
        table.add_column(col, justify="left" if col in ("run", "device") else "right")
    for point, fit in rows:
        after = point.predicted(fit.reserve)
        table.add_row(
            Text(point.run),
            Text(point.device),
            format_bytes(point.measured),
            format_bytes(point.predicted(point.reserve_before)),
            format_bytes(after),
            _pct(after / point.measured - 1),
        )
    return table


def _allocator_table(result: Calibration) -> Table | None:
    if not result.allocator_peaks:
        return None
    table = Table(
        title="Run-log peak memory (the allocator's; on a CPU the process's) vs predicted live tensors; fits nothing",
        title_justify="left",
    )
    for col in ("run", "device", "run log peak", "predicted tensors", "residual"):
        table.add_column(col, justify="left" if col in ("run", "device") else "right")
    for peak in result.allocator_peaks:
        table.add_row(
            Text(peak.run),
            Text(peak.device),
            format_bytes(peak.measured),
            format_bytes(peak.tensors),
            _pct(peak.tensors / peak.measured - 1) if peak.measured > 0 else "-",
        )
    return table


def _notes(result: Calibration, written: tuple[Path, Path] | None) -> list[Text]:
    notes: list[Text] = [Text(f"warning: {w}", style="bold yellow") for w in result.warnings]
    free = len(result.identified)
    compute = (
        f"one compute factor per block kind for {', '.join(result.per_kind)}, per device type otherwise"
        if result.per_kind
        else "one compute factor per device type"
        + (" (the run logs cannot tell the block kinds apart)" if len(result.kinds) > 1 else "")
    )
    notes.append(
        Text(
            f"{result.n_rows} measured figures, {result.n_used} parameters used by the measured plans, "
            f"{free} identified; {compute}."
        )
    )
    if result.n_rows < result.n_used:
        notes.append(
            Text(
                f"fewer measured figures than parameters: the prior (measurements within {NOISE:.0%}, inputs within "
                f"a factor e^{PRIOR_WIDTH:g}) keeps the fit well-posed; parameters the data resolve less than "
                f"{RESOLUTION:.0%} keep their input values",
                style="yellow",
            )
        )
    if len(result.runs) == 1:
        notes.append(Text("one run: no leave-one-out error (measure a second plan to get one)", style="yellow"))
    if written:
        notes.append(Text(f"wrote {written[0]} and {written[1]}"))
    return notes


def calibration_renderables(result: Calibration, written: tuple[Path, Path] | None = None) -> list[Any]:
    """Tables and notes, in reading order."""
    items: list[Any] = [_runs_table(result)]
    for table in (_compute_table(result), _params_table(result), _memory_table(result), _allocator_table(result)):
        if table is not None:
            items.append(table)
    return items + _notes(result, written)


def calibration_json(result: Calibration, written: tuple[Path, Path] | None = None) -> dict[str, Any]:
    """The same content for scripts."""
    return {
        "runs": [
            {
                "name": r.name,
                "measured_s": r.measured,
                "predicted_before_s": r.before,
                "predicted_after_s": r.after,
                "residual": r.residual,
                "loo_error": r.loo_error,
                "compute": [c.__dict__ for c in r.compute],
            }
            for r in result.runs
        ],
        "parameters": [
            {
                "name": p.name,
                "prior": p.prior,
                "value": p.value,
                "identified": p.identified,
                "why": p.reason,
            }
            for p in result.params
        ],
        "reserve": {r.type: {"before": r.before, "bytes": r.reserve} for r in result.reserves},
        "per_kind": result.per_kind,
        "warnings": result.warnings,
        "written": [str(p) for p in written] if written else [],
    }

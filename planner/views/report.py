"""Measured beside predicted: a run log held against the plan that produced it.

:func:`median_iteration` is also what ``hetplan launch`` prints at the end of a run, so that the
launch summary and ``hetplan report`` give one median for one run.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from hetplan.contracts.plan import Plan
from hetplan.contracts.runlog import CentralRecord, StepRecord
from hetplan.units import format_bytes, format_time

__all__ = ["WARMUP_STEPS", "median_iteration", "report_renderables", "report_rows"]

#: Steps left out of a median as warm-up (the first step fills caches and allocators, and on a CPU
#: run it is also the one whose memory the ranks do not measure), unless no other step remains.
WARMUP_STEPS = 1


def median_iteration(steps_and_times: Iterable[tuple[int, float]], *, skip_steps: int = WARMUP_STEPS) -> float | None:
    """The median over steps of the slowest rank's iteration (a step lasts as long as that), from
    ``(step, iteration_s)`` of every rank's record; the first ``skip_steps`` steps are left out as
    warm-up unless that would leave none. None for no records.

    The median of an even count is the mean of the middle two (``statistics.median``).
    """
    slowest: dict[int, float] = {}
    for step, seconds in steps_and_times:
        slowest[step] = max(slowest.get(step, 0.0), seconds)
    if not slowest:
        return None
    steps = sorted(slowest)
    first = steps[min(skip_steps, len(steps) - 1)]
    return statistics.median(t for s, t in slowest.items() if s >= first)


def report_rows(
    records: list[StepRecord],
    plan: Plan,
    *,
    skip_steps: int = WARMUP_STEPS,
    emulated_plan: bool = False,
    central: Sequence[CentralRecord] = (),
) -> dict[str, Any]:
    """Per stage and in total: measured (median over steps after the warm-up ones) vs predicted;
    ``central``: the run log's central-process line (wsp's parameter server), a memory row of its own."""
    steps = sorted({r.step for r in records})
    kept = [r for r in records if r.step >= steps[min(skip_steps, len(steps) - 1)]]
    predicted = plan.predicted or {}
    by_stage: dict[tuple[int, int], list[StepRecord]] = {}
    for r in kept:
        by_stage.setdefault((r.pipeline, r.stage), []).append(r)
    stages = []
    for entry in predicted.get("stages", []):
        key = (entry["pipeline"], entry["stage"])
        rs = by_stage.get(key, [])
        per_step: dict[int, float] = {}
        for r in rs:  # the slowest replica of the stage, per step
            per_step[r.step] = max(per_step.get(r.step, 0.0), r.compute_s)
        measured = statistics.median(per_step.values()) if per_step else None
        want = entry["fwd_s"] + entry["bwd_s"]
        stages.append(
            {
                "pipeline": key[0],
                "stage": key[1],
                "measured_compute_s": measured,
                "predicted_compute_s": want,
                "error": (measured / want - 1) if measured and want else None,
            }
        )
    measured_iter = median_iteration(((r.step, r.iteration_s) for r in records), skip_steps=skip_steps)
    want_iter = predicted.get("iteration_s")
    losses = [r.loss for r in records if r.loss is not None and r.rank == 0]
    return {
        "memory": _memory_rows(records, predicted.get("memory", {})) + _central_rows(central, predicted.get("central")),
        "steps": len(steps),
        "skipped_warmup_steps": min(skip_steps, len(steps) - 1),
        "measured_iteration_s": measured_iter,
        "predicted_iteration_s": want_iter,
        "iteration_error": (measured_iter / want_iter - 1) if measured_iter and want_iter else None,
        "nonfinite_steps": sorted({r.step for r in records if r.nonfinite}),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "emulated": any(r.emulated_slowdown for r in records),
        "warnings": (
            [
                "the plan's devices are emulated types but the run did not emulate them (--emulate): "
                "the predictions assume the emulated speeds"
            ]
            if emulated_plan and not any(r.emulated_slowdown for r in records)
            else []
        ),
        "stages": stages,
    }


def _memory_rows(records: list[StepRecord], predicted: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rank: the measured peak of live tensor bytes beside the memory walk's prediction of it.

    Both count tensors only (the allocator's view): the plan's ``tensor_bytes``, not its ``peak_bytes``
    (which adds fragmentation and the device type's reserve to decide whether the plan fits).
    """
    rows = []
    for rank in sorted({r.rank for r in records}):
        rs = [r for r in records if r.rank == rank]
        measured = [r.peak_memory_bytes for r in rs if r.peak_memory_bytes is not None]
        entry = predicted.get(rs[0].device, {})
        want = entry.get("tensor_bytes")
        peak = max(measured) if measured else None
        rows.append(
            {
                "rank": rank,
                "device": rs[0].device,
                "peak_memory_bytes": peak,
                "predicted_peak_memory_bytes": want,
                "error": (peak / want - 1) if peak is not None and want else None,
                "measured_by": next((r.memory_measured for r in rs if r.memory_measured), None),
            }
        )
    return rows


def _central_rows(central: Sequence[CentralRecord], predicted: Any) -> list[dict[str, Any]]:
    """The central process's measured peak (host memory) beside ``predicted.central``'s tensors."""
    want = predicted.get("tensor_bytes") if isinstance(predicted, dict) else None
    return [
        {
            "rank": c.rank,
            "device": f"{c.role} (host)",
            "peak_memory_bytes": c.peak_memory_bytes,
            "predicted_peak_memory_bytes": want,
            "error": (c.peak_memory_bytes / want - 1) if want else None,
            "measured_by": c.memory_measured,
        }
        for c in central
    ]


def report_renderables(rows: dict[str, Any]) -> list[Any]:
    out: list[Any] = [Text(f"warning: {w}", style="bold yellow") for w in rows.get("warnings", [])]
    if rows["emulated"]:
        out.append(Text("device speeds were EMULATED on this machine (slowdown factors)", style="bold yellow"))
    table = Table(title="Measured vs predicted (median over steps, warm-up excluded)", title_justify="left")
    for col in ("what", "measured", "predicted", "error"):
        table.add_column(col, justify="right" if col != "what" else "left")

    def fmt(v: float | None) -> str:
        return format_time(v) if v is not None else "-"

    def err(v: float | None) -> str:
        return f"{v:+.1%}" if v is not None else "-"

    for s in rows["stages"]:
        table.add_row(
            f"pipeline {s['pipeline']} stage {s['stage']} compute",
            fmt(s["measured_compute_s"]),
            fmt(s["predicted_compute_s"]),
            err(s["error"]),
        )
    table.add_row(
        Text("iteration", style="bold"),
        fmt(rows["measured_iteration_s"]),
        fmt(rows["predicted_iteration_s"]),
        err(rows["iteration_error"]),
    )
    out.append(table)
    if any(m["peak_memory_bytes"] is not None for m in rows.get("memory", [])):
        memory = Table(title="Peak tensor memory per rank (measured at the allocator)", title_justify="left")
        for col in ("rank", "device", "measured", "predicted", "error"):
            memory.add_column(col, justify="left" if col == "device" else "right")
        for m in rows["memory"]:
            memory.add_row(
                str(m["rank"]),
                m["device"],
                format_bytes(m["peak_memory_bytes"]) if m["peak_memory_bytes"] is not None else "-",
                format_bytes(m["predicted_peak_memory_bytes"]) if m["predicted_peak_memory_bytes"] else "-",
                err(m["error"]),
            )
        out.append(memory)
    if rows["first_loss"] is not None:
        out.append(Text(f"loss {rows['first_loss']:.4f} -> {rows['last_loss']:.4f} over {rows['steps']} steps"))
    if rows.get("nonfinite_steps"):
        bad = rows["nonfinite_steps"]
        out.append(Text(f"{len(bad)} step(s) with a non-finite loss or gradient, not applied: {bad}", style="yellow"))
    return out

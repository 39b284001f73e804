"""Draw a co-run with the single-job timeline and trace writers: one row per device and job.

    result = simulate_together(jobs, timeline=True)
    write_together_timeline(result, "co.svg", title="A + B on rtx-mix")   # or .png
    write_together_trace(result, "co.trace.json", title="A + B on rtx-mix")

The co-run is handed to :mod:`hetplan.simulate.timeline` and :mod:`hetplan.simulate.trace` as a
:class:`SimResult` whose rows are ``"node0/0 A"``, ``"node0/0 B"``, ...: a device's jobs on adjacent
rows, so that one computes while the other waits is visible at a glance, and in the trace each node
stays one process (its rows are threads). Task descriptions are the simulator's own, so the trace
reads them back as it does for one job. What the single-job pictures call the iteration is here the
whole run drawn: the subtitle and the trace's metadata say what each job did instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetplan import __version__
from hetplan.simulate.simulator import DeviceStats, SimResult
from hetplan.simulate.timeline import Text, check_timeline_path, layout, render_svg
from hetplan.simulate.trace import check_trace_path, chrome_trace
from hetplan.units import format_time

if TYPE_CHECKING:
    from hetplan.simulate.together import PreparedJob, TogetherResult, TogetherRun

__all__ = ["drawing", "write_together_timeline", "write_together_trace"]

_COMPUTE = ("F", "B", "step")


def row_key(address: str, label: str) -> str:
    """A device's row for one job (the node stays the text before ``/``, as the trace groups by it)."""
    return f"{address} {label}"


def drawing(prepared: Sequence[PreparedJob], together: TogetherRun, result: TogetherResult) -> SimResult:
    """The co-run as a :class:`SimResult` the timeline and trace writers draw (module docstring)."""
    run = together.run
    rows: list[tuple[str, str, float, float, str]] = []
    busy: dict[str, list[float]] = {}  # row -> compute, optimizer seconds
    for t, info in enumerate(together.meta):
        label = prepared[together.owner[t][0]].job.label
        lo, hi = run.start[t], run.end[t]
        if info.kind == "allreduce":
            groups = prepared[together.owner[t][0]].compiled.groups
            for address in groups[info.group].devices:
                rows.append((row_key(address, label), info.kind, lo, hi, str(info)))
            continue
        key = row_key(info.device, label)
        rows.append((key, info.kind, lo, hi, str(info)))
        if info.kind in _COMPUTE:
            spent = busy.setdefault(key, [0.0, 0.0])
            spent[1 if info.kind == "step" else 0] += hi - lo
    devices: dict[str, DeviceStats] = {}
    for address in together.devices:
        for p in prepared:
            if address not in p.sim.devices:
                continue
            d = p.sim.devices[address]
            key = row_key(address, p.job.label)
            compute_s, optimizer_s = busy.get(key, [0.0, 0.0])
            devices[key] = DeviceStats(
                address=key,
                type=d.type,
                pipeline=d.pipeline,
                stage=d.stage,
                compute_s=compute_s,
                optimizer_s=optimizer_s,
                comm_s=0.0,
                idle_s=max(0.0, run.makespan - compute_s - optimizer_s),
                memory=d.memory,
            )
    total = sum(v[0] + v[1] for v in busy.values())
    span = run.makespan
    return SimResult(
        iteration_s=span,
        global_batch=sum(j.global_batch for j in result.jobs),
        bubble_fraction=max(0.0, 1.0 - total / (span * len(together.devices))) if span > 0 else 0.0,
        devices=devices,
        stages=[],
        critical_path=[],
        bottleneck="",
        timeline=rows,
        n_tasks=len(together.meta),
    )


def subtitle(result: TogetherResult) -> str:
    """What each job did: the line under the title in place of the single-job iteration summary."""
    jobs = "; ".join(
        f"{j.label}: {format_time(j.co_iteration_s)}/iteration together, {format_time(j.solo_iteration_s)} alone"
        for j in result.jobs
    )
    return (
        f"{result.policy}: {jobs}; combined {result.combined_samples_per_s:,.1f} samples/s; "
        f"{'+'.join(str(j.iterations) for j in result.jobs)} iterations drawn over {format_time(result.span_s)}"
    )


def _picture(result: TogetherResult, title: str) -> tuple[Any, str]:
    """The timeline layout with the co-run's subtitle, and the subtitle the single-job layout wrote."""
    assert result.drawing is not None
    picture = layout(result.drawing, title=title)
    old = next(s.text for s in picture.shapes if isinstance(s, Text) and s.text.startswith("iteration "))
    shapes = [s._replace(text=subtitle(result)) if isinstance(s, Text) and s.text == old else s for s in picture.shapes]
    return picture._replace(shapes=shapes), old


def write_together_timeline(result: TogetherResult, path: str | Path, *, title: str = "") -> None:
    """Write the co-run's timeline as ``.svg`` or ``.png`` (by the suffix; PNG needs matplotlib)."""
    check_timeline_path(path)
    if result.drawing is None:
        raise RuntimeError("simulate_together(..., timeline=True) records what is drawn")
    target = Path(path)
    picture, old = _picture(result, title)
    if target.suffix.lower() == ".svg":
        svg = render_svg(result.drawing, title=title)
        new = subtitle(result)
        data = svg.replace(f">{escape(old)}</text>", f">{escape(new)}</text>", 1).encode("utf-8")
    else:
        from hetplan.simulate.png import render_png

        data = render_png(picture)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


def write_together_trace(result: TogetherResult, path: str | Path, *, title: str = "") -> None:
    """Write the co-run as a Chrome trace (``.json``, one event per line, as the single-job trace)."""
    check_trace_path(path)
    if result.drawing is None:
        raise RuntimeError("simulate_together(..., timeline=True) records what is drawn")
    trace = chrome_trace(result.drawing, title=title)
    other = {
        "tool": f"hetplan {__version__}",
        "title": title,
        "policy": result.policy,
        "span_s": result.span_s,
        "combined_samples_per_s": result.combined_samples_per_s,
        "tasks": trace["otherData"]["tasks"],
        "time_unit": trace["otherData"]["time_unit"],
    }
    for j in result.jobs:
        other[f"job {j.label}"] = (
            f"{j.file or j.label}: {j.co_iteration_s:.9f} s/iteration together, {j.solo_iteration_s:.9f} s alone"
        )
    events = trace["traceEvents"]
    lines = ['{"traceEvents": [']
    for i, event in enumerate(events):
        lines.append(json.dumps(event, ensure_ascii=False, allow_nan=False) + ("," if i < len(events) - 1 else ""))
    lines.append('], "otherData": ' + json.dumps(other, ensure_ascii=False, allow_nan=False) + "}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")

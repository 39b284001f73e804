"""A simulated iteration as a Chrome trace (the JSON Perfetto and ``chrome://tracing`` open).

    result = simulate(plan, profile, cluster, timeline=True)
    write_trace(result, "plan.trace.json", cluster=cluster, title="gpt on mixed-a100-v100")
    # open it at https://ui.perfetto.dev (or chrome://tracing), as a PyTorch profiler trace

The file is the Trace Event Format's JSON object form: ``{"traceEvents": [...], "otherData": {...}}``.
Each node of the cluster is a process, each device a thread of it (its compute row: forwards,
backwards, the optimizer step), and each task of the simulation one complete event (``"ph": "X"``,
``ts`` and ``dur`` in microseconds). Transfers are drawn on the sender, all-reduces on every member of
their group. Communication overlaps compute and other communication, and events on one thread must
nest, so each device's transfers and all-reduces go on extra rows of its own (``node0/0 comm``,
``node0/0 comm 2``), packed greedily. Metadata events (``"ph": "M"``) name the processes and threads
and fix their order; emulated device types say so in the row name.

Choices made for Perfetto's JSON importer (``src/trace_processor/importers/json``), which is stricter
than the format's text: no ``displayTimeUnit`` (Perfetto reads it as the unit of ``ts``), only the
top-level keys it knows (it stops reading at an unknown one), no list-valued key at the top level
of an event (its tokenizer refuses them while it looks for ``ts``), no ``\\uXXXX`` escapes (it
cannot read them: non-ASCII text is written as UTF-8), thread ids unique across processes, and
process ids from 1. Times are rounded to the nanosecond; the same simulation gives the same bytes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hetplan import __version__
from hetplan.contracts.cluster import Cluster
from hetplan.errors import HetplanError
from hetplan.simulate.simulator import SimResult

__all__ = ["CATEGORIES", "check_trace_path", "chrome_trace", "parse_label", "write_trace"]

#: Trace category of each task kind (``SimResult.timeline`` kinds).
CATEGORIES = {"F": "forward", "B": "backward", "send": "transfer", "allreduce": "allreduce", "step": "optimizer"}

#: Thread ids: ``device number * _TID_STRIDE + row`` (row 0 compute, 1.. communication).
_TID_STRIDE = 1000

# The task descriptions the simulator writes (``hetplan.simulate.simulator.TaskInfo.__str__``).
_LABELS = {
    "compute": re.compile(
        r"^(?P<kind>[FB])(?P<micro_batch>\d+) of pipeline (?P<pipeline>\d+) stage (?P<stage>\d+) on \S+$"
    ),
    "send": re.compile(r"^transfer of micro-batch (?P<micro_batch>\d+) (?P<src>\S+) -> (?P<peer>\S+)$"),
    "allreduce": re.compile(r"^all-reduce of gradient group (?P<group>\d+)$"),
    "step": re.compile(r"^optimizer step of pipeline (?P<pipeline>\d+) stage (?P<stage>\d+) on \S+$"),
}


def parse_label(kind: str, label: str) -> dict[str, Any]:
    """The numbers a task's description carries (micro-batch, pipeline, stage, peer, group).

    The simulator's timeline rows hold a readable description, not fields; reading it back keeps
    the trace a pure function of :class:`SimResult`. An unknown form gives ``{}`` (the event then
    carries the description alone), never an error.
    """
    pattern = _LABELS["compute" if kind in ("F", "B") else kind] if kind in CATEGORIES else None
    match = pattern.match(label) if pattern else None
    if match is None:
        return {}
    out: dict[str, Any] = {}
    for key, value in match.groupdict().items():
        if key in ("kind", "src"):
            continue
        out[key] = value if key == "peer" else int(value)
    return out


def _us(seconds: float) -> float:
    """Seconds as microseconds, rounded to the nanosecond (short, deterministic JSON numbers)."""
    return round(seconds * 1e6, 3)


def _event_name(kind: str, fields: dict[str, Any], label: str) -> str:
    if kind in ("F", "B") and "micro_batch" in fields:
        return f"{kind}{fields['micro_batch']}"
    if kind == "send" and "peer" in fields:
        return f"send {fields['micro_batch']} to {fields['peer']}"
    if kind == "allreduce" and "group" in fields:
        return f"all-reduce g{fields['group']}"
    if kind == "step":
        return "optimizer step"
    return label


class _Task:
    """One task of the simulation as the timeline rows give it (an all-reduce on all its rows)."""

    __slots__ = ("fields", "hi", "index", "kind", "label", "lo", "rows")

    def __init__(self, index: int, kind: str, lo: float, hi: float, label: str, row: str) -> None:
        self.index, self.kind, self.lo, self.hi, self.label = index, kind, lo, hi, label
        self.rows = [row]
        self.fields = parse_label(kind, label)


def _tasks(result: SimResult) -> list[_Task]:
    """Timeline rows grouped back into tasks, numbered in the simulator's task order.

    The rows come in task order with an all-reduce repeated once per member, one after the other
    (same description, same times): consecutive such rows are one task.
    """
    tasks: list[_Task] = []
    for row, kind, lo, hi, label in result.timeline:
        last = tasks[-1] if tasks else None
        if (
            kind == "allreduce"
            and last is not None
            and last.kind == "allreduce"
            and (last.label, last.lo, last.hi) == (label, lo, hi)
        ):
            last.rows.append(row)
            continue
        tasks.append(_Task(len(tasks), kind, lo, hi, label, row))
    return tasks


def _device_label(address: str, result: SimResult, cluster: Cluster | None) -> str:
    d = result.devices[address]
    kind = cluster.device(address).type.label() if cluster is not None else d.type
    return f"{address} {kind} (pipeline {d.pipeline} stage {d.stage})"


def _lanes(spans: list[tuple[float, float, int]]) -> dict[int, int]:
    """Communication row (1, 2, ...) of each event on one device: the first whose events have all
    ended by its start (greedy interval partitioning, in start order: as few rows as overlap needs)."""
    ends: list[float] = []
    lane_of: dict[int, int] = {}
    for lo, hi, key in sorted(spans):
        for i, end in enumerate(ends):
            if end <= lo:
                ends[i] = hi
                lane_of[key] = i + 1
                break
        else:
            ends.append(hi)
            lane_of[key] = len(ends)
    return lane_of


def chrome_trace(result: SimResult, *, cluster: Cluster | None = None, title: str = "") -> dict[str, Any]:
    """The trace as a JSON-ready mapping (see the module docstring).

    Args:
        result: a simulation run with ``timeline=True``.
        cluster: the cluster simulated; gives node order and device type labels (emulation included).
            Without it, nodes come in the order of the devices and rows show the type name alone.
        title: written to ``otherData`` (chrome://tracing shows it as metadata; Perfetto may not).

    Returns:
        ``{"traceEvents": [...], "otherData": {...}}``: metadata events first, then one complete
        event per task and row, in the simulator's task order.
    """
    if not result.timeline:
        raise HetplanError("no timeline was recorded; simulate with timeline=True")
    devices = list(result.devices)
    node_order = (
        [n.name for n in cluster.nodes if any(a.split("/")[0] == n.name for a in devices)]
        if cluster is not None
        else list(dict.fromkeys(a.split("/")[0] for a in devices))
    )
    pid_of = {node: i + 1 for i, node in enumerate(node_order)}
    number = {a: i + 1 for i, a in enumerate(devices)}
    tasks = _tasks(result)

    comm_spans: dict[str, list[tuple[float, float, int]]] = {a: [] for a in devices}
    for t in tasks:
        if t.kind in ("send", "allreduce"):
            for row in t.rows:
                comm_spans[row].append((_us(t.lo), _us(t.hi), t.index))
    lanes = {a: _lanes(spans) for a, spans in comm_spans.items()}

    emulated_nodes = {a.split("/")[0] for a in devices if cluster is not None and cluster.device(a).type.emulated}
    meta: list[dict[str, Any]] = []
    for node, pid in pid_of.items():
        name = f"{node} (EMULATED device speeds)" if node in emulated_nodes else node
        # tid = pid: a process-level event on a thread id no device row uses (those start at 1000)
        meta.append({"name": "process_name", "ph": "M", "pid": pid, "tid": pid, "args": {"name": name}})
        meta.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": pid, "args": {"sort_index": pid}})
    for address in devices:
        pid, base = pid_of[address.split("/")[0]], number[address] * _TID_STRIDE
        rows = [(base, _device_label(address, result, cluster))]
        n_comm = max(lanes[address].values(), default=0)
        rows += [(base + k, f"{address} comm" + (f" {k}" if k > 1 else "")) for k in range(1, n_comm + 1)]
        for tid, name in rows:
            meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})

    events: list[dict[str, Any]] = []
    for t in tasks:
        ts = _us(t.lo)
        dur = round(_us(t.hi) - ts, 3)
        for row in t.rows:
            if row not in number:
                raise HetplanError(f"timeline row {row!r} is not a device of the simulation")
            args: dict[str, Any] = {"task": t.index, "what": t.label, "device": row, **t.fields}
            if t.kind == "allreduce":
                args["members"] = list(t.rows)
                lane = lanes[row][t.index]
            else:  # the device's own pipeline and stage (a transfer's: its sender's)
                d = result.devices[row]
                args["pipeline"], args["stage"] = d.pipeline, d.stage
                lane = lanes[row][t.index] if t.kind == "send" else 0
            events.append(
                {
                    "name": _event_name(t.kind, t.fields, t.label),
                    "cat": CATEGORIES.get(t.kind, t.kind),
                    "ph": "X",
                    "ts": ts,
                    "dur": dur,
                    "pid": pid_of[row.split("/")[0]],
                    "tid": number[row] * _TID_STRIDE + lane,
                    "args": args,
                }
            )
    other: dict[str, Any] = {
        "tool": f"hetplan {__version__}",
        "title": title,
        "iteration_s": result.iteration_s,
        "bubble_fraction": result.bubble_fraction,
        "bottleneck": result.bottleneck,
        "tasks": len(tasks),
        "time_unit": "ts and dur in microseconds (the Trace Event Format's unit)",
    }
    if emulated_nodes:
        other["emulated"] = "device speeds are EMULATED (slowdown factors), not measured accelerators"
    return {"traceEvents": meta + events, "otherData": other}


def check_trace_path(path: str | Path) -> None:
    """Refuse, before any work, a trace file name that is not ``.json``."""
    if Path(path).suffix.lower() != ".json":
        raise HetplanError(
            f"a Chrome trace is a .json file, got {Path(path).name!r}; use for example plan.trace.json", field="--trace"
        )


def write_trace(result: SimResult, path: str | Path, *, cluster: Cluster | None = None, title: str = "") -> None:
    """Write :func:`chrome_trace` to ``path`` (``.json``; UTF-8, one event per line)."""
    check_trace_path(path)
    target = Path(path)
    trace = chrome_trace(result, cluster=cluster, title=title)
    lines = ['{"traceEvents": [']
    events = trace["traceEvents"]
    for i, event in enumerate(events):
        lines.append(json.dumps(event, ensure_ascii=False, allow_nan=False) + ("," if i < len(events) - 1 else ""))
    lines.append('], "otherData": ' + json.dumps(trace["otherData"], ensure_ascii=False, allow_nan=False) + "}")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")

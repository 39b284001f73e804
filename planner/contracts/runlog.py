"""The run log: what the runtime measured, one JSON object a line, per step and per rank.

    records = load_run_log("run.jsonl")
    records[0].compute_s, records[0].wait_s, records[0].comm_s, records[0].loss

Each record says which pipeline and stage the rank ran, so measured times can be put beside the
plan's predicted per-stage times. ``loss`` is the mean over the whole global batch (the same on
every rank of a step) or null on ranks that do not compute it. ``emulated_slowdown`` is present
when the rank emulated a slower device type. ``lr`` (the step's learning rate), ``grad_norm`` (the
2-norm of the whole model's gradient before clipping, the same on every rank; null when it was not
finite) and ``clipped`` (present when the run clips: whether this step did) follow the optimizer.

Sync modes: ``loss`` is the global batch's mean loss in every mode. Under ``wsp`` and ``sdpipe`` the
pipelines do not meet every step (no job-wide all-reduce), so each rank logs its pipeline's mean loss
as ``pipeline_loss`` and the pipeline's samples per step as ``pipeline_batch``, with ``loss`` null;
the merged run log (:func:`fill_global_loss`, which the launcher and :func:`load_run_log` apply) sets
every record's ``loss`` to the sample-weighted mean over the pipelines' lines of the step, the same
mean the all-reduce modes log (null while a pipeline's line of the step is missing). ``wave`` (wsp,
at a wave's end: ``clock``, the ``version`` of the weights pulled, ``waves_ahead`` of the slowest the
next wave runs, ``own_waves``: the device's own pushed waves that version lacks, added back) and
``group`` (sdpipe: the pipelines this step averaged with) say how the pipelines met; sdpipe's
``grad_norm`` is the norm of the rank's pipeline's mean gradient (each pipeline clips its own).
``emulated_link_s`` (emulation only) is what the rank slept this step to make emulated links as slow
as the cluster states. ``nonfinite`` is present on a step whose loss (``nan``, ``inf``, ``-inf``;
``loss`` is then null) or, without loss scaling, gradient (``gradient``) was not finite: every rank
skipped that step's update.

**The central process** (wsp's parameter server) trains nothing and has no step lines: it writes one
line of its own, ``{"schema", "kind": "central", "rank", "role", "peak_memory_bytes",
"memory_measured"}``, its peak of live tensor bytes over its first clocks (host memory, measured at
the CPU allocator). :func:`load_run_log` checks such lines and leaves them out of the step records;
:func:`load_central_records` reads them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import DTYPES
from hetplan.contracts.fields import Fields
from hetplan.contracts.plan import Plan
from hetplan.contracts.yamlio import read_text
from hetplan.errors import HetplanError

__all__ = [
    "RUNLOG_SCHEMA",
    "CentralRecord",
    "StepRecord",
    "central_record",
    "check_log_matches",
    "fill_global_loss",
    "global_batch_losses",
    "is_central",
    "load_central_records",
    "load_run_log",
    "parse_record",
]

RUNLOG_SCHEMA = "hetplan/run-log/v1"

#: What a step's ``nonfinite`` names: the loss's value, or the gradient (its norm, without loss scaling).
NONFINITE = ("nan", "inf", "-inf", "gradient")


@dataclass(frozen=True)
class StepRecord:
    step: int
    rank: int
    pipeline: int
    stage: int
    device: str
    iteration_s: float
    compute_s: float
    wait_s: float
    comm_s: float
    loss: float | None
    peak_memory_bytes: float | None  # peak live tensor bytes; None on a CPU step that was not measured
    emulated_slowdown: float | None = None
    memory_measured: str | None = None  # how: "cuda allocator" or "cpu allocator profile"
    dtype: str | None = None
    loss_scale: float | None = None  # fp16 runs: the dynamic loss scale used this step
    skipped_step: bool | None = None  # fp16 runs: the step was skipped (a gradient overflowed)
    lr: float | None = None  # the learning rate this step used (after warm-up and decay)
    grad_norm: float | None = None  # the whole model's gradient 2-norm before clipping
    clipped: bool | None = None  # runs that clip: whether the norm was above the maximum this step
    wave: dict[str, int] | None = None  # wsp, at a wave's end: clock, version pulled, waves ahead, own waves
    group: tuple[int, ...] | None = None  # sdpipe: the pipelines averaged with this step
    emulated_link_s: float | None = None  # emulation: seconds slept to pace emulated links
    transport: str | None = None  # "host-staged": gloo carried a GPU rank's tensors through host memory
    nonfinite: str | None = None  # the loss ("nan", "inf", "-inf") or "gradient" was not finite: not applied
    pipeline_loss: float | None = None  # wsp, sdpipe: the mean loss of this rank's pipeline's samples
    pipeline_batch: int | None = None  # wsp, sdpipe: the samples of this rank's pipeline per step

    def to_json(self) -> str:
        data: dict[str, Any] = {"schema": RUNLOG_SCHEMA, **asdict(self)}
        return json.dumps(data, sort_keys=False)


def _optional_bool(f: Fields, key: str) -> bool | None:
    value = f.raw(key, None)
    if value is not None and not isinstance(value, bool):
        raise f.error(f"expected true or false, got {value!r}", key)
    return value


def _wave(f: Fields) -> dict[str, int] | None:
    w = f.child("wave", None)
    if w is None:
        return None
    out = {k: w.integer(k, minimum=0) for k in ("clock", "version", "waves_ahead")}
    own = w.integer("own_waves", None, minimum=0)  # the device's pushed waves the pulled version lacks
    if own is not None:
        out["own_waves"] = own
    w.done()
    return out


def _group(f: Fields) -> tuple[int, ...] | None:
    g = f.list("group", None)
    if g is None:
        return None
    return tuple(f.check_integer(p, f"group[{i}]", minimum=0) for i, p in enumerate(g))


def parse_record(data: Any, *, file: str | None, line: int) -> StepRecord:
    f = Fields(data, file=file, path=f"line {line}")
    schema = f.str("schema")
    if schema != RUNLOG_SCHEMA:
        raise f.error(f"expected schema {RUNLOG_SCHEMA}, got {schema!r}", "schema")
    loss = f.raw("loss", None)
    if loss is not None:
        loss = f.check_number(loss, "loss")
    record = StepRecord(
        step=f.integer("step", minimum=0),
        rank=f.integer("rank", minimum=0),
        pipeline=f.integer("pipeline", minimum=0),
        stage=f.integer("stage", minimum=0),
        device=f.str("device"),
        iteration_s=f.number("iteration_s", minimum=0.0),
        compute_s=f.number("compute_s", minimum=0.0),
        wait_s=f.number("wait_s", minimum=0.0),
        comm_s=f.number("comm_s", minimum=0.0),
        loss=loss,
        peak_memory_bytes=f.number("peak_memory_bytes", None, minimum=0.0),
        emulated_slowdown=f.number("emulated_slowdown", None, minimum=1.0),
        memory_measured=f.str("memory_measured", None),
        dtype=f.str("dtype", None, choices=DTYPES),
        loss_scale=f.number("loss_scale", None, positive=True),
        skipped_step=_optional_bool(f, "skipped_step"),
        lr=f.number("lr", None, minimum=0.0),
        grad_norm=f.number("grad_norm", None, minimum=0.0),
        clipped=_optional_bool(f, "clipped"),
        wave=_wave(f),
        group=_group(f),
        emulated_link_s=f.number("emulated_link_s", None, minimum=0.0),
        transport=f.str("transport", None, choices=("host-staged",)),
        nonfinite=f.str("nonfinite", None, choices=NONFINITE),
        pipeline_loss=f.number("pipeline_loss", None),
        pipeline_batch=f.integer("pipeline_batch", None, minimum=1),
    )
    f.done()
    return record


@dataclass(frozen=True)
class CentralRecord:
    """The central process's line: its role and measured peak of live tensor bytes (host memory)."""

    rank: int
    role: str
    peak_memory_bytes: float
    memory_measured: str


def central_record(rank: int, sync: str, peak: float) -> dict[str, Any]:
    """The line the central process of ``sync`` writes (wsp: the parameter server)."""
    return {
        "schema": RUNLOG_SCHEMA,
        "kind": "central",
        "rank": rank,
        "role": f"{sync} parameter server" if sync == "wsp" else f"{sync} central process",
        "peak_memory_bytes": peak,
        "memory_measured": "cpu allocator profile",
    }


def is_central(data: Any) -> bool:
    """Whether a run-log line (parsed JSON, of any shape) is the central process's, not a step's."""
    return isinstance(data, Mapping) and data.get("kind") == "central"


def _parse_central(data: Any, *, file: str | None, line: int) -> CentralRecord:
    f = Fields(data, file=file, path=f"line {line}")
    schema = f.str("schema")
    if schema != RUNLOG_SCHEMA:
        raise f.error(f"expected schema {RUNLOG_SCHEMA}, got {schema!r}", "schema")
    f.str("kind", choices=("central",))
    record = CentralRecord(
        rank=f.integer("rank", minimum=0),
        role=f.str("role"),
        peak_memory_bytes=f.number("peak_memory_bytes", minimum=0.0),
        memory_measured=f.str("memory_measured"),
    )
    f.done()
    return record


def _lines(path: str | Path) -> Iterable[tuple[int, Any]]:
    """(line number, JSON value) of every non-empty line; a line that is not JSON says so."""
    name = str(path)
    text = read_text(path, kind="a JSON-lines run log", what="JSON lines")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as exc:
            raise HetplanError(
                f"not JSON: {exc.msg} at column {exc.colno}", file=name, field=f"line {number}"
            ) from None
        except RecursionError:
            raise HetplanError("JSON nested too deeply to read", file=name, field=f"line {number}") from None


def load_central_records(path: str | Path) -> list[CentralRecord]:
    """The central process's lines of a run log (none for the modes without one)."""
    return [_parse_central(data, file=str(path), line=n) for n, data in _lines(path) if is_central(data)]


def load_run_log(path: str | Path) -> list[StepRecord]:
    """Read every step record of a JSON-lines run log (the central process's line is checked and
    left out: :func:`load_central_records`); a bad line is reported by its number."""
    name = str(path)
    records = []
    for number, data in _lines(path):
        if is_central(data):
            _parse_central(data, file=name, line=number)
            continue
        records.append(parse_record(data, file=name, line=number))
    if not records:
        raise HetplanError("empty run log", file=name)
    if any(r.pipeline_loss is not None and r.loss is None for r in records):  # ranks' lines, not merged
        losses = global_batch_losses((r.step, r.pipeline, r.pipeline_loss, r.pipeline_batch) for r in records)
        records = [replace(r, loss=losses[r.step]) if r.step in losses else r for r in records]
    return records


def global_batch_losses(
    lines: Iterable[tuple[int, int, float | None, int | None]], *, global_batch: int | None = None
) -> dict[int, float]:
    """Per step, the global batch's mean loss from the pipelines' own: ``lines`` are each record's
    ``(step, pipeline, pipeline_loss, pipeline_batch)``; a step's loss is ``sum(b_p * loss_p) /
    sum(b_p)`` over the pipelines, the sample-weighted mean the all-reduce modes log.

    Why in the log and not in the run: under wsp and sdpipe the pipelines step apart, so no rank
    knows the other pipelines' losses of its step without waiting for them (which would undo the
    mode). A step gets a loss only once every pipeline of the log (and, given ``global_batch``, all
    of its samples) has a finite line for it; the devices of a pipeline log the same
    ``pipeline_loss`` (all-reduced inside the pipeline), so the first line of a pipeline counts.
    """
    per_step: dict[int, dict[int, tuple[float, int]]] = {}
    pipelines: set[int] = set()
    for step, pipeline, loss, batch in lines:
        if loss is None or batch is None:
            continue
        pipelines.add(pipeline)
        per_step.setdefault(step, {}).setdefault(pipeline, (float(loss), int(batch)))
    out = {}
    for step, by_pipe in per_step.items():
        samples = sum(b for _, b in by_pipe.values())
        if set(by_pipe) != pipelines or (global_batch is not None and samples != global_batch):
            continue  # a pipeline has not logged this step (yet): no global loss
        loss = math.fsum(b * value for value, b in by_pipe.values()) / samples
        if math.isfinite(loss):
            out[step] = loss
    return out


def fill_global_loss(records: list[Mapping[str, Any]], *, global_batch: int | None = None) -> list[dict[str, Any]]:
    """The run-log lines (dicts) with ``loss`` set from the pipelines' ``pipeline_loss`` where the
    ranks logged those (wsp, sdpipe; :func:`global_batch_losses`); other lines are returned as they are."""
    if not any(r.get("pipeline_loss") is not None for r in records):
        return [dict(r) for r in records]
    losses = global_batch_losses(
        ((r["step"], r["pipeline"], r.get("pipeline_loss"), r.get("pipeline_batch")) for r in records),
        global_batch=global_batch,
    )
    return [
        {**r, "loss": losses[r["step"]]} if r.get("pipeline_loss") is not None and r["step"] in losses else dict(r)
        for r in records
    ]


def check_log_matches(records: list[StepRecord], plan: Plan, *, log_file: str | None = None) -> None:
    """Refuse a run log that another plan produced: every record's device must be in its stage, and
    every device of the plan must have records."""
    stages = {(pi, si): set(st.devices) for pi, p in enumerate(plan.pipelines) for si, st in enumerate(p.stages)}
    for r in records:
        if r.device not in stages.get((r.pipeline, r.stage), set()):
            raise HetplanError(
                f"rank {r.rank} ran {r.device} as pipeline {r.pipeline} stage {r.stage}, which plan "
                f"{plan.file or '(given)'} does not have: the log was produced by another plan",
                file=log_file,
                field=f"step {r.step} rank {r.rank}",
            )
    missing = {d for devices in stages.values() for d in devices} - {r.device for r in records}
    if missing:
        raise HetplanError(
            f"no record from {', '.join(sorted(missing))}, which the plan uses: the log was produced by another plan",
            file=log_file,
            field="device",
        )

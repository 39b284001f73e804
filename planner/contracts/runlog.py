"""The run log: what the runtime measured, one JSON object a line, per step and per rank.

    records = load_run_log("run.jsonl")
    records[0].compute_s, records[0].wait_s, records[0].comm_s, records[0].loss

Each record says which pipeline and stage the rank ran, so measured times can be put beside the
plan's predicted per-stage times. ``loss`` is the mean over the whole global batch (the same on
every rank of a step) or null on ranks that do not compute it. ``emulated_slowdown`` is present
when the rank emulated a slower device type. ``lr`` (the step's learning rate), ``grad_norm`` (the
2-norm of the whole model's gradient before clipping, the same on every rank; null when it was not
finite) and ``clipped`` (present when the run clips: whether this step did) follow the optimizer.

Sync modes: under ``wsp`` and ``sdpipe`` the pipelines do not meet every step, so ``loss`` is the
rank's *pipeline's* mean loss; ``wave`` (wsp, at a wave's end: ``clock``, the ``version`` of the
weights pulled, ``waves_ahead`` of the slowest the next wave runs) and ``group`` (sdpipe: the
pipelines this step averaged with) say how the pipelines met. ``emulated_link_s`` (emulation only) is
what the rank slept this step to make emulated links as slow as the cluster states. ``nonfinite``
is present on a step whose loss (``nan``, ``inf``, ``-inf``; ``loss`` is then null) or, without
loss scaling, gradient (``gradient``) was not finite: every rank skipped that step's update.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import DTYPES
from hetplan.contracts.fields import Fields
from hetplan.contracts.plan import Plan
from hetplan.contracts.yamlio import read_text
from hetplan.errors import HetplanError

__all__ = ["RUNLOG_SCHEMA", "StepRecord", "check_log_matches", "load_run_log", "parse_record"]

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
    wave: dict[str, int] | None = None  # wsp, at a wave's end: clock, version pulled, waves ahead
    group: tuple[int, ...] | None = None  # sdpipe: the pipelines averaged with this step
    emulated_link_s: float | None = None  # emulation: seconds slept to pace emulated links
    transport: str | None = None  # "host-staged": gloo carried a GPU rank's tensors through host memory
    nonfinite: str | None = None  # the loss ("nan", "inf", "-inf") or "gradient" was not finite: not applied

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
    )
    f.done()
    return record


def load_run_log(path: str | Path) -> list[StepRecord]:
    """Read every record of a JSON-lines run log; a bad line is reported by its number."""
    name = str(path)
    text = read_text(path, kind="a JSON-lines run log", what="JSON lines")
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HetplanError(
                f"not JSON: {exc.msg} at column {exc.colno}", file=name, field=f"line {number}"
            ) from None
        except RecursionError:
            raise HetplanError("JSON nested too deeply to read", file=name, field=f"line {number}") from None
        records.append(parse_record(data, file=name, line=number))
    if not records:
        raise HetplanError("empty run log", file=name)
    return records


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

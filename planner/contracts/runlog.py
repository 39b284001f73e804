"""The run log: what the runtime measured, one JSON object a line, per step and per rank.

    records = load_run_log("run.jsonl")
    records[0].compute_s, records[0].wait_s, records[0].comm_s, records[0].loss

Each record says which pipeline and stage the rank ran, so measured times can be put beside the
plan's predicted per-stage times. ``loss`` is the mean over the whole global batch (the same on
every rank of a step) or null on ranks that do not compute it. ``emulated_slowdown`` is present
when the rank emulated a slower device type.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from planner.contracts.fields import Fields
from planner.contracts.yamlio import read_text
from planner.errors import HetplanError

__all__ = ["RUNLOG_SCHEMA", "StepRecord", "load_run_log", "parse_record"]

RUNLOG_SCHEMA = "hetplan/run-log/v1"


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
    peak_memory_bytes: float
    emulated_slowdown: float | None = None

    def to_json(self) -> str:
        data: dict[str, Any] = {"schema": RUNLOG_SCHEMA, **asdict(self)}
        return json.dumps(data, sort_keys=False)


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
        peak_memory_bytes=f.number("peak_memory_bytes", minimum=0.0),
        emulated_slowdown=f.number("emulated_slowdown", None, minimum=1.0),
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

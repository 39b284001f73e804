"""Measured runs of plans on one cluster: what ``hetplan calibrate`` fits the cost model to.

    measurements = load_measurements("measured.yaml")
    for run in measurements.runs:
        run.plan, run.iteration_s, run.run_log, run.peak_memory

A run is a plan that was trained on the cluster, with either the iteration time any runtime measured
(``iteration_s``, seconds per training step) or the run log ``hetplan launch --log`` wrote
(``run_log``), and optionally the peak memory each device's process reached (``peak_memory``,
``{NODE/INDEX: size}``, reserve included, as ``nvidia-smi`` reports it). Paths are relative to the
measurements file's folder. This module checks the file itself; that each plan fits the profile and
cluster being calibrated, and each run log fits its plan, is checked where those are loaded
(:mod:`hetplan.calibrate.inputs`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hetplan.contracts.fields import Fields
from hetplan.contracts.yamlio import read_mapping, schema_of

__all__ = ["MEASUREMENTS_SCHEMA", "MeasuredRun", "Measurements", "load_measurements", "parse_measurements"]

MEASUREMENTS_SCHEMA = "hetplan/measurements/v1"


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run: the plan, how long a step took (given or from a run log), peak memory."""

    index: int
    name: str
    plan: Path
    iteration_s: float | None = None  # seconds per step, from any runtime (None: from the run log)
    run_log: Path | None = None
    peak_memory: dict[str, float] = field(default_factory=dict)  # device address -> bytes, process level

    @property
    def where(self) -> str:
        """The field path of this run in the measurements file (for located errors)."""
        return f"runs[{self.index}]"


@dataclass
class Measurements:
    runs: list[MeasuredRun]
    description: str = ""
    file: str | None = None


def _resolve(f: Fields, key: str, base: Path, *, required: bool = False) -> Path | None:
    """A path field, relative to the measurements file's folder; it must name an existing file."""
    raw = f.str(key) if required else f.str(key, None)
    if raw is None:
        return None
    path = Path(raw)
    if not path.is_absolute():
        path = base / path
    if not path.is_file():
        raise f.error(f"no such file {str(path)!r} (paths are relative to the measurements file's folder)", key)
    return path


def _peak_memory(f: Fields) -> dict[str, float]:
    items = f.mapping_items("peak_memory", [])
    sizes = f.sub("peak_memory", dict(items)) if items else None
    out: dict[str, float] = {}
    for address, _ in items:
        if not isinstance(address, str) or address.count("/") != 1:
            raise f.error(f"expected a device address NODE/INDEX, got {address!r}", f"peak_memory.{address}")
        assert sizes is not None
        out[address] = sizes.bytes(address)
    return out


def _parse_run(r: Fields, index: int, base: Path) -> MeasuredRun:
    plan = _resolve(r, "plan", base, required=True)
    run_log = _resolve(r, "run_log", base)
    iteration = r.number("iteration_s", None, positive=True)
    name = r.str("name", None)
    peak = _peak_memory(r)
    r.done()  # a misspelt key first: "iteraton_s" is a typo, not a missing iteration time
    if iteration is not None and run_log is not None:
        raise r.error("give the iteration time either as iteration_s or through run_log, not both", "iteration_s")
    if iteration is None and run_log is None:
        raise r.error("missing required field: iteration_s (seconds per step) or run_log (from hetplan launch)")
    assert plan is not None
    return MeasuredRun(
        index=index,
        name=name or "",
        plan=plan,
        iteration_s=iteration,
        run_log=run_log,
        peak_memory=peak,
    )


def parse_measurements(data: dict[str, Any], *, file: str | None = None) -> Measurements:
    """Build :class:`Measurements` from a parsed mapping, checking every field and that files exist."""
    f = Fields(data, file=file)
    schema = f.str("schema")
    if schema != MEASUREMENTS_SCHEMA:
        raise f.error(f"expected schema {MEASUREMENTS_SCHEMA}, got {schema!r}", "schema")
    description = f.str("description", "")
    base = Path(file).parent if file else Path(".")
    runs: list[MeasuredRun] = []
    names: dict[str, int] = {}
    for i, r in enumerate(f.list("runs")):
        if not isinstance(r, Fields):
            raise f.error("expected a mapping such as {plan: plan.yaml, iteration_s: 1.47}", f"runs[{i}]")
        run = _parse_run(r, i, base)
        if run.name and run.name in names:
            raise r.error(f"duplicate run name {run.name!r} (also runs[{names[run.name]}])", "name")
        names[run.name] = i
        runs.append(run)
    # unnamed runs are called by their run log's or plan's file name, numbered where that repeats
    given = {run.name for run in runs if run.name}
    for i, run in enumerate(runs):
        if not run.name:
            label = (run.run_log or run.plan).name
            if label in given:
                label = f"{label} #{i}"
            given.add(label)
            runs[i] = replace(run, name=label)
    f.done()
    return Measurements(runs=runs, description=description, file=file)


def load_measurements(path: str | Path) -> Measurements:
    """Load and validate a measurements file."""
    data = read_mapping(path)
    schema_of(data, path)
    return parse_measurements(data, file=str(path))

"""Measured runs made ready to fit: each plan checked against the profile and cluster, each run log
reduced to the figures the fit compares with the simulator.

A run log has one record per step and rank. The first step is a warm-up (allocations, first-touch
pages, thread pools), so a run's iteration time is the median over the later steps of the slowest
rank's step (every rank ends a step at the same synchronisation, so the slowest one is the
iteration), and each rank's compute time the median of its ``compute_s`` over the same steps.
Medians, not means: on a shared machine one step in ten is hit by something else.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.measurements import MeasuredRun, Measurements
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan, check_plan, load_plan
from hetplan.contracts.runlog import check_log_matches, load_run_log
from hetplan.errors import HetplanError
from hetplan.schedule.compile import CompiledPlan, compile_plan

__all__ = ["WARMUP_STEPS", "Observation", "load_observations"]

#: Steps of a run log left out as warm-up.
WARMUP_STEPS = 1


@dataclass
class Observation:
    """One measured run, as the fit sees it."""

    name: str
    plan: Plan
    compiled: CompiledPlan
    iteration_s: float  # measured seconds per step
    compute_s: dict[str, float] = field(default_factory=dict)  # device -> median compute per step (run logs)
    peak_memory: dict[str, float] = field(default_factory=dict)  # device -> process peak bytes (any runtime)
    allocator_peak: dict[str, float] = field(default_factory=dict)  # device -> run log peak_memory_bytes
    steps: int = 0  # steps the medians are over (0: a single figure given in the file)
    files: dict[str, Path] = field(default_factory=dict)  # "plan", "run_log": what it was read from
    warnings: list[str] = field(default_factory=list)


def _from_log(obs: Observation, run: MeasuredRun, cluster: Cluster) -> None:
    assert run.run_log is not None
    log = str(run.run_log)
    records = load_run_log(run.run_log)
    check_log_matches(records, obs.plan, log_file=log)
    steps = sorted({r.step for r in records})
    kept = steps[WARMUP_STEPS:] or steps  # a one-step log has no warm-up to spare
    kept_set = set(kept)
    per_step: dict[int, float] = {}
    compute: dict[str, list[float]] = {}
    for r in records:
        if r.peak_memory_bytes is not None:  # None: a CPU step whose memory was not measured
            obs.allocator_peak[r.device] = max(obs.allocator_peak.get(r.device, 0.0), r.peak_memory_bytes)
        if r.step not in kept_set:
            continue
        per_step[r.step] = max(per_step.get(r.step, 0.0), r.iteration_s)
        compute.setdefault(r.device, []).append(r.compute_s)
    obs.iteration_s = statistics.median(per_step[s] for s in kept)
    if obs.iteration_s <= 0:
        raise HetplanError("every kept step took 0 s: nothing to fit", file=log, field="iteration_s")
    obs.compute_s = {d: statistics.median(v) for d, v in sorted(compute.items())}
    obs.steps = len(kept)
    emulated = [a for a in obs.plan.all_devices() if cluster.device(a).type.emulated]
    if emulated and not any(r.emulated_slowdown for r in records):
        obs.warnings.append(
            f"{run.name}: the plan's devices {', '.join(emulated)} are emulated types but the run did not "
            "emulate them (launch --emulate): the fit treats its times as theirs"
        )


def _check_memory_devices(run: MeasuredRun, plan: Plan, file: str | None) -> None:
    used = set(plan.all_devices())
    for address in run.peak_memory:
        if address not in used:
            raise HetplanError(
                f"device {address} is not used by plan {run.plan.name} (it uses {', '.join(sorted(used))})",
                file=file,
                field=f"{run.where}.peak_memory.{address}",
            )


def load_observations(measurements: Measurements, profile: ModelProfile, cluster: Cluster) -> list[Observation]:
    """Every run of ``measurements``, checked against ``profile`` and ``cluster``.

    The plans are checked against the profile and cluster being calibrated, not the files they
    name: those may be the analytic profile the plan was made from, while the measurements are of
    this cluster.
    """
    observations = []
    for run in measurements.runs:
        plan = load_plan(run.plan)
        check_plan(plan, cluster, profile)
        _check_memory_devices(run, plan, measurements.file)
        obs = Observation(
            name=run.name,
            plan=plan,
            compiled=compile_plan(plan, len(profile.blocks)),
            iteration_s=run.iteration_s or 0.0,
            peak_memory=dict(run.peak_memory),
            files={"plan": run.plan},
        )
        if run.run_log is not None:
            obs.files["run_log"] = run.run_log
            _from_log(obs, run, cluster)
        observations.append(obs)
    return observations

"""Train a plan on this machine: its rank config, every rank spawned here, and what it did.

    job = train_here(plan, profile, cluster, steps=20, emulate=True, log="run.jsonl")
    job.summary      # 'trained 20 steps on 2 ranks (EMULATED device speeds): loss 6.26 -> 5.56; ...'

What ``hetplan launch`` runs (cli.py only parses and prints). It orchestrates layers, as
:mod:`hetplan.demo` does: the rank config (:mod:`hetplan.emit`), the checks that should fail once
here rather than once per rank (a text file, a user dataset), and the local launcher
(:mod:`hetplan.runtime.launcher`).

    corun = train_together([(plan_a, profile_a, cluster), (plan_b, profile_b, cluster)], steps=20, ...)
    corun.summary    # one line per job, then their combined samples/s and each shared device's split

``train_together`` runs two plans' jobs at once on the same devices (crossover scheduling: one
job computes while the other communicates, :mod:`hetplan.runtime.processes.crossover`); each job trains as
it would alone.

    crowding_warning(plan, threads=1)   # 'warning: 6 ranks x 1 thread on this machine's 2 cores: ...'

The summary's median iteration is :func:`hetplan.views.report.median_iteration`, the one ``hetplan
report`` prints for the same run log.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.emulation import SlowdownSchedule, Straggler
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.views.report import median_iteration

__all__ = ["CoRun", "LocalJob", "TrainingOptions", "crowding_warning", "train_here", "train_together"]


@dataclass(frozen=True)
class TrainingOptions:
    """How the ranks train, beyond the plan (``build_rank_config``'s keywords; defaults: the plan's)."""

    seed: int = 0
    lr: float | None = None
    optimizer: str | None = None
    weight_decay: float | None = None
    clip_grad_norm: float | None = None
    warmup_steps: int = 0
    decay_steps: int = 0
    min_lr: float = 0.0
    data: str | None = None
    dataset: str | None = None
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)
    compute_device: str | None = None  # cuda under gloo: the host-staged transport
    accept_device_mismatch: bool = False
    init_from: str | None = None  # weights to start from (hetplan.runtime.weights.init_from)

    def rank_config_kwargs(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "lr": self.lr,
            "optimizer": self.optimizer,
            "weight_decay": self.weight_decay,
            "clip_grad_norm": self.clip_grad_norm,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "min_lr": self.min_lr,
            "data": self.data,
            "dataset": self.dataset,
            "dataset_kwargs": self.dataset_kwargs or None,
            "compute_device": self.compute_device,
            "accept_device_mismatch": self.accept_device_mismatch,
            "init_from": self.init_from,
        }


@dataclass
class LocalJob:
    records: list[dict[str, Any]]
    ranks: int
    summary: str


def _check_inputs(profile: ModelProfile, plan: Plan, options: TrainingOptions) -> TrainingOptions:
    """Fail here, in one line, rather than in every rank: the text file, the user dataset."""
    if options.data:
        from hetplan.models import resolve_model
        from hetplan.runtime.textdata import batches_for

        data = str(Path(options.data).resolve())
        batches_for(profile.model, resolve_model(profile.model), data)
        options = TrainingOptions(**{**options.__dict__, "data": data})
    if options.init_from:  # every block's tensors there, of the right shapes: one line here, not one per rank
        from hetplan.runtime.weights.init_from import check_init_from

        init_from = check_init_from(profile.model, options.init_from)
        options = TrainingOptions(**{**options.__dict__, "init_from": init_from})
    if options.dataset:
        from hetplan.runtime.dataset import check_dataset

        check_dataset(
            profile.model, options.dataset, options.dataset_kwargs, global_batch=plan.global_batch, seed=options.seed
        )
    return options


def add_stragglers(config: dict[str, Any], stragglers: Sequence[Straggler], *, emulate: bool) -> None:
    """Write each ``--straggler DEVICE:FACTORx@STEP`` into the rank config's device entry (its
    ``slowdown_changes``); a device the plan does not use, or no ``--emulate``, is a one-line error."""
    if stragglers and not emulate:
        raise HetplanError("stragglers are emulation: add --emulate", field="--straggler")
    entries = {d["address"]: d for d in config["devices"]}
    for s in stragglers:
        entry = entries.get(s.device)
        if entry is None:
            raise HetplanError(
                f"device {s.device} is not in the plan (its devices: {', '.join(entries)})", field="--straggler"
            )
        schedule = SlowdownSchedule(entry["emulated_slowdown"], tuple(map(tuple, entry.get("slowdown_changes", []))))
        # the factor is relative to the device's base type, as the cluster's emulated slowdowns are
        entry["slowdown_changes"] = [list(c) for c in schedule.with_change(s.step, s.factor).changes]


def train_here(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    *,
    steps: int,
    options: TrainingOptions,
    emulate: bool = False,
    log: str | None = None,
    save: str | None = None,
    save_every: int | None = None,
    keep_last: int | None = None,
    resume: str | None = None,
    resume_step: int | None = None,
    threads: int = 1,
    progress: Callable[[int, int], None] | None = None,
    stragglers: Sequence[Straggler] = (),
    on_step: Callable[[Any], None] | None = None,
    skip_nonfinite: bool = False,
) -> LocalJob:
    """Train ``steps`` steps of ``plan`` with every rank on this machine (gloo); ``stragglers``
    (emulation, with ``emulate``) make a device slower from a step on. ``on_step`` gets each
    finished step (:class:`hetplan.runtime.processes.watch.StepLine`); a non-finite loss stops the run with
    one line unless ``skip_nonfinite`` (then its update is skipped on every rank, and counted)."""
    from hetplan.runtime.launcher import launch_local

    if skip_nonfinite and plan.sync in ("wsp", "sdpipe"):
        raise HetplanError(
            f"sync {plan.sync}'s pipelines step apart, so no step can be skipped on all of them together",
            field="--skip-nonfinite",
        )
    options = _check_inputs(profile, plan, options)
    config = build_rank_config(plan, profile, cluster, backend="gloo", **options.rank_config_kwargs())
    add_stragglers(config, stragglers, emulate=emulate)
    folder = Path(tempfile.mkdtemp(prefix="hetplan-launch-"))
    try:
        write_yaml(config, folder / "rank-config.yaml")
        result = launch_local(
            folder / "rank-config.yaml",
            steps=steps,
            log=log,
            emulate=emulate,
            save=save,
            save_every=save_every,
            keep_last=keep_last,
            resume=resume,
            resume_step=resume_step,
            threads=threads,
            progress=progress,
            on_step=on_step,
            skip_nonfinite=skip_nonfinite,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ranks = len(config["devices"])
    return LocalJob(records=result.records, ranks=ranks, summary=_summary(plan, result.records, ranks, emulate))


def _median_iteration(records: list[dict[str, Any]]) -> float:
    """``hetplan report``'s median (warm-up step excluded) of a run's records; NaN for none."""
    median = median_iteration((r["step"], r["iteration_s"]) for r in records)
    return median if median is not None else float("nan")


def _summary(plan: Plan, records: list[dict[str, Any]], ranks: int, emulate: bool) -> str:
    done = [r for r in records if r["rank"] == 0]
    losses = [r["loss"] for r in done if r["loss"] is not None]
    skipped = sum(1 for r in done if r.get("nonfinite"))
    median = _median_iteration(records)
    label = " (EMULATED device speeds)" if emulate else ""
    predicted = plan.predicted.get("iteration_s") if plan.predicted else None
    loss = f"loss {losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "no finite loss"
    return (
        f"trained {len(done)} steps on {ranks} ranks{label}: {loss}; "
        + (f"{skipped} non-finite step(s) skipped; " if skipped else "")
        + f"median iteration {median * 1e3:.1f} ms ({plan.global_batch / median:.1f} samples/s)"
        + (f"; predicted {predicted * 1e3:.1f} ms" if predicted is not None else "")
    )


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform says; else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def crowding_warning(plans: Sequence[Plan], *, threads: int, cores: int | None = None) -> str | None:
    """One line when the ranks of ``plans`` (run here, ``threads`` torch threads each) outnumber this
    machine's cores: they then take turns on the cores, and each step lasts about that many times
    the plan's prediction; None when they fit."""
    cores = cores or usable_cores()
    ranks = sum(len(p.all_devices()) for p in plans)
    wanted = ranks * threads
    if wanted <= cores:
        return None
    factor = wanted / cores
    predicted = [p.predicted.get("iteration_s") for p in plans if p.predicted]
    likely = (
        f": steps will likely take about {factor:.1f}x the predicted "
        + ", ".join(f"{t * 1e3:.1f} ms (~{t * factor * 1e3:.0f} ms)" for t in predicted if t)
        if any(predicted)
        else f": steps will likely run about {factor:.1f}x slower than on {wanted} free cores"
    )
    return (
        f"warning: {ranks} ranks x {threads} thread{'s' if threads > 1 else ''} share this machine's "
        f"{cores} core{'s' if cores > 1 else ''}{likely} (docs/benchmarks.md, Runtime)"
    )


# -- two jobs on the same devices -------------------------------------------------------------------

#: The co-run jobs' names, in the order their plans are given (run logs, folders, messages).
JOB_NAMES = ("a", "b")


@dataclass
class CoRun:
    """What :func:`train_together` did: each job as :func:`train_here` reports it, and the turns."""

    jobs: list[LocalJob]
    #: per device, the moments each job held it: ``(job, start, end)`` in monotonic seconds
    turns: dict[str, list[tuple[str, float, float]]]
    wall_s: float
    summary: str
    #: each job's run log (None: not written)
    logs: list[str | None] = field(default_factory=list)


def _per_job(value: str | Path | Sequence[str | Path] | None, what: str, *, file: bool) -> list[str | None]:
    """One path per job: a pair as given; one path made two (``run.jsonl`` -> ``run-a.jsonl``,
    ``run-b.jsonl``; a folder ``ckpt`` -> ``ckpt/a``, ``ckpt/b``); None for none."""
    if value is None:
        return [None] * len(JOB_NAMES)
    if isinstance(value, (str, Path)):
        path = Path(value)
        if file:
            return [str(path.with_name(f"{path.stem}-{n}{path.suffix}")) for n in JOB_NAMES]
        return [str(path / n) for n in JOB_NAMES]
    values = [str(v) if v is not None else None for v in value]
    if len(values) != len(JOB_NAMES):
        raise HetplanError(f"expected one per job ({len(JOB_NAMES)}), got {len(values)}", field=what)
    return values


def _check_co_runnable(jobs: Sequence[tuple[Plan, ModelProfile, Cluster]]) -> None:
    """Jobs share a device by its address: the address must be the same device in every job's
    cluster (else the turn would serialise two different devices, or emulate one at two speeds).
    Tensor-parallel stages are refused (their collectives run inside compute, which holds the turn:
    see :mod:`hetplan.runtime.processes.crossover`)."""
    seen: dict[str, tuple[str, float, str]] = {}
    for (plan, _, cluster), name in zip(jobs, JOB_NAMES, strict=False):
        for i, pipe in enumerate(plan.pipelines):
            for j, stage in enumerate(pipe.stages):
                if stage.tensor_parallel > 1:
                    raise HetplanError(
                        "co-running a tensor-parallel stage is not built (its collectives run inside compute, "
                        "which holds the device's turn)",
                        file=plan.file,
                        field=f"pipelines[{i}].stages[{j}].tensor_parallel",
                    )
        kinds = {d.address: d.type for d in cluster.devices}
        for address in plan.all_devices():
            kind = kinds.get(address)
            if kind is None:
                continue  # build_rank_config says so, with the plan's own words
            mine = (kind.name, kind.slowdown if kind.emulated else 1.0, name)
            other = seen.setdefault(address, mine)
            if other[:2] != mine[:2]:
                raise HetplanError(
                    f"device {address} is a {other[0]} (slowdown {other[1]:g}) in job {other[2]}'s cluster and a "
                    f"{mine[0]} (slowdown {mine[1]:g}) in job {name}'s: co-run jobs share devices by address, so "
                    "plan both on the same cluster",
                    file=plan.file,
                    field="devices",
                )


def train_together(
    jobs: Sequence[tuple[Plan, ModelProfile, Cluster]],
    *,
    steps: int,
    options: TrainingOptions | Sequence[TrainingOptions],
    emulate: bool = False,
    log: str | Path | Sequence[str | Path] | None = None,
    save: str | Path | Sequence[str | Path] | None = None,
    save_every: int | None = None,
    keep_last: int | None = None,
    resume: str | Path | Sequence[str | Path] | None = None,
    resume_step: int | None = None,
    threads: int = 1,
    progress: Callable[[int, int], None] | None = None,
    stragglers: Sequence[Straggler] = (),
    stall_s: float | None = None,
    kill_rank_after: tuple[int, int, float] | None = None,
    skip_nonfinite: bool = False,
) -> CoRun:
    """Train two plans' jobs at once on this machine, sharing the devices they both use.

    ``jobs``: two ``(plan, profile, cluster)``, named ``a`` and ``b`` in that order (the CLI's
    ``_plan_and_inputs`` gives one per plan file). Each job is its own torchrun group with its own
    run folder and run log, and trains exactly as :func:`train_here` would train it alone; the ranks
    of the two jobs on one device take turns at it (:mod:`hetplan.runtime.processes.crossover`): a rank holds
    the turn while it computes and lets go while it communicates, so one job's communication hides
    behind the other's compute. The options are :func:`train_here`'s, for both jobs (``options``
    may also be one per job: two jobs may train with different seeds, rates, data): ``log`` one
    path (``run.jsonl`` -> ``run-a.jsonl`` and ``run-b.jsonl``) or one per job; ``save`` and
    ``resume`` one folder (``DIR/a``, ``DIR/b``) or one per job; a straggler slows its device for
    every job that uses it. ``progress(done, steps)`` follows the slower job. A failure of either
    job stops both, with one line per job. ``kill_rank_after=(job index, rank, seconds)`` is for
    fault tests. A non-finite loss stops a job (``skip_nonfinite`` is not built for a co-run).
    """
    from hetplan.runtime.processes.crossover import launch_together, read_turn_traces

    if len(jobs) != len(JOB_NAMES):
        raise HetplanError(f"expected {len(JOB_NAMES)} plans to co-run, got {len(jobs)}", field="PLAN")
    if skip_nonfinite:
        raise HetplanError(
            "not built for two jobs at once (a co-run stops at a non-finite loss)", field="--skip-nonfinite"
        )
    _check_co_runnable(jobs)
    logs = _per_job(log, "--log", file=True)
    saves = _per_job(save, "--save", file=False)
    resumes = _per_job(resume, "--resume", file=False)
    if stragglers and not emulate:
        raise HetplanError("stragglers are emulation: add --emulate", field="--straggler")
    used = {a for plan, _, _ in jobs for a in plan.all_devices()}
    for s in stragglers:
        if s.device not in used:
            raise HetplanError(f"device {s.device} is not in either plan (their devices: "
                               f"{', '.join(sorted(used))})", field="--straggler")  # fmt: skip
    per_job = [options] * len(jobs) if isinstance(options, TrainingOptions) else list(options)
    if len(per_job) != len(jobs):
        raise HetplanError(f"expected one set of training options per job ({len(jobs)}), got {len(per_job)}")
    folder = Path(tempfile.mkdtemp(prefix="hetplan-corun-"))
    turns = folder / "turns"
    try:
        paths, configs = [], []
        for (plan, profile, cluster), job_options in zip(jobs, per_job, strict=True):
            job_options = _check_inputs(profile, plan, job_options)
            config = build_rank_config(plan, profile, cluster, backend="gloo", **job_options.rank_config_kwargs())
            add_stragglers(config, [s for s in stragglers if s.device in plan.all_devices()], emulate=emulate)
            configs.append(config)
        ranks = sum(len(c["devices"]) for c in configs)  # the start line: every device rank of both jobs
        for config, name in zip(configs, JOB_NAMES, strict=True):
            config["crossover"] = {"turns": str(turns), "job": name, "ranks": ranks}
            write_yaml(config, folder / f"rank-config-{name}.yaml")
            paths.append(folder / f"rank-config-{name}.yaml")
        start = time.time()
        results = launch_together(
            paths,
            steps=steps,
            names=JOB_NAMES,
            logs=logs,
            emulate=emulate,
            saves=saves,
            save_every=save_every,
            keep_last=keep_last,
            resumes=resumes,
            resume_step=resume_step,
            threads=threads,
            progress=progress,
            stall_s=stall_s,
            kill_rank_after=kill_rank_after,
        )
        wall = time.time() - start
        held = read_turn_traces(turns)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    from hetplan.runtime.launcher import refuse_nonfinite

    for result, job_log in zip(results, logs, strict=True):  # a co-run's ranks stop at a non-finite loss
        refuse_nonfinite(result.records, job_log)
    done = []
    for (plan, _, _), config, result in zip(jobs, configs, results, strict=True):
        ranks = len(config["devices"])
        done.append(
            LocalJob(records=result.records, ranks=ranks, summary=_summary(plan, result.records, ranks, emulate))
        )
    return CoRun(jobs=done, turns=held, wall_s=wall, summary=_corun_summary(jobs, done, held), logs=logs)


def _corun_summary(
    jobs: Sequence[tuple[Plan, ModelProfile, Cluster]], done: list[LocalJob], held: dict[str, list]
) -> str:
    """One line per job, then the two together: samples/s from each job's median iteration while
    co-running, and how much of the shared devices' time each job held them."""
    lines = [f"job {name}: co-run, {job.summary}" for name, job in zip(JOB_NAMES, done, strict=True)]
    rate = sum(plan.global_batch / _median_iteration(job.records) for (plan, _, _), job in zip(jobs, done, strict=True))
    shared = sorted(d for d, rows in held.items() if len({r[0] for r in rows}) > 1)
    share = []
    for d in shared:
        rows = held[d]
        span = max(r[2] for r in rows) - min(r[1] for r in rows)
        busy = {n: sum(b - a for j, a, b in rows if j == n) for n in JOB_NAMES}
        share.append(f"{d} " + "/".join(f"{n} {busy[n] / span:.0%}" for n in JOB_NAMES))
    lines.append(
        f"together: {rate:.1f} samples/s (sum of the jobs' median rates); "
        + (f"devices held (compute) {', '.join(share)}" if share else "no device shared")
    )
    return "\n".join(lines)

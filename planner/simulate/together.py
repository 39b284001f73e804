"""Simulate training jobs that share GPUs: each job's action lists, timed together.

    jobs = [TogetherJob("A", plan_a, profile_a, cluster), TogetherJob("B", plan_b, profile_b, cluster)]
    result = simulate_together(jobs, policy="crossover", iterations=6)
    result.jobs[0].co_iteration_s, result.jobs[0].solo_iteration_s, result.combined_samples_per_s

Each job compiles and builds its task graph exactly as :func:`hetplan.simulate.simulate` does (the
same tasks, durations, flows and edges: one truth for the cost model), repeated for several
iterations; the graphs are joined into one run in which the jobs share what they would share on a
real cluster (:mod:`hetplan.simulate.exclusive`): each device computes one task at a time, the order
between jobs decided by a stated policy; inter-node transfers of both jobs share each node's network
interface (the flows of the cost model, section 4); collectives of different jobs on a device run
one after the other. Nothing else is shared: each job keeps its own memory (both must fit,
:func:`hetplan.simulate.together_checks.check_memory_together`).

**Iterations.** A job's iteration ``i + 1`` on a device starts after its iteration ``i`` there has
ended (its optimizer step and collectives): each rank runs its action list once per step, with no
barrier between steps, so a pipeline's next fill overlaps its last drain as on the runtime. Each job
runs enough iterations for the jobs to run side by side over about the same span: ``iterations``
periods of the job with the longest solo period, the others as many as fit in that span (within
400,000 tasks in all); where the jobs keep other paces together than alone (one starves the other)
so that a job is measured over fewer than two iterations, or the window below is shorter than a
period, the run is made again, counted by their paces together.
The **steady-state iteration** of a job is measured inside the window in which every job has
finished its warm-up (the first third of its iterations, at least one: the first fills an empty
pipeline, and the jobs take a few iterations to settle into their interleaving) and no job has
finished yet, so a job running alone at the start or the end does not flatter the figure: the mean
period between its iteration ends inside the window where it ended at least three there, else (one
job starves the other) the window's length over the iterations' worth of work it did in it
(:func:`steady_state`). Solo figures are measured the same way (the job alone, ``iterations``
iterations), beside the single iteration of ``simulate``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.errors import HetplanError
from hetplan.schedule.compile import CompiledPlan, compile_plan, gc_paused, with_shared_groups
from hetplan.simulate.costs import CostModel
from hetplan.simulate.engine import Engine
from hetplan.simulate.exclusive import POLICIES, RUNTIME_POLICIES, ExclusiveRun, Sharing, run_exclusive
from hetplan.simulate.simulator import SimResult, _build, check_memory, simulate
from hetplan.simulate.together_checks import check_memory_together, check_same_cluster
from hetplan.simulate.vocab import whole_vocab_profile

__all__ = [
    "POLICIES",
    "RUNTIME_POLICIES",
    "JobOutcome",
    "PreparedJob",
    "TogetherJob",
    "TogetherResult",
    "TogetherRun",
    "prepare_job",
    "run_together",
    "simulate_together",
]

#: The most tasks one co-run holds (the fastest jobs run fewer iterations to fit).
MAX_TASKS = 400_000
_COMPUTE = ("F", "B", "step")


@dataclass(frozen=True)
class TogetherJob:
    """One job: its plan, and the profile and cluster it was made for (the clusters must agree)."""

    label: str
    plan: Plan
    profile: ModelProfile
    cluster: Cluster


@dataclass
class PreparedJob:
    """A job's one-iteration task graph and solo figures, built once (co-plan reuses it for many pairs)."""

    job: TogetherJob
    compiled: CompiledPlan
    engine: Engine  # one iteration, as the simulator builds it (not run)
    capacity: dict[Any, float]
    sim: SimResult  # the single solo iteration (``hetplan simulate``)
    solo_period_s: float = 0.0  # steady-state solo iteration (module docstring)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.compiled.programs)

    @property
    def empty(self) -> bool:
        return len(self.engine) == 0


@dataclass(frozen=True)
class JobOutcome:
    """What one job did in a co-run, beside what it does alone."""

    label: str
    file: str
    global_batch: int
    devices: tuple[str, ...]
    iteration_s: float  # one solo iteration, as ``hetplan simulate`` gives it
    solo_iteration_s: float  # steady state, alone
    co_iteration_s: float  # steady state, together
    iterations: int  # run in the co-run
    measured: float  # iterations the steady state is measured over (periods, or work done)
    wait_s: float  # per iteration, summed over its devices: compute held back by another job's

    @property
    def slowdown(self) -> float:
        return self.co_iteration_s / self.solo_iteration_s if self.solo_iteration_s > 0 else 1.0

    @property
    def solo_samples_per_s(self) -> float:
        return self.global_batch / self.solo_iteration_s if self.solo_iteration_s > 0 else 0.0

    @property
    def co_samples_per_s(self) -> float:
        return self.global_batch / self.co_iteration_s if self.co_iteration_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "file": self.file,
            "global_batch": self.global_batch,
            "devices": list(self.devices),
            "iteration_s": self.iteration_s,
            "solo_iteration_s": self.solo_iteration_s,
            "co_iteration_s": self.co_iteration_s,
            "slowdown": self.slowdown,
            "solo_samples_per_s": self.solo_samples_per_s,
            "co_samples_per_s": self.co_samples_per_s,
            "iterations": self.iterations,
            "measured_iterations": round(self.measured, 6),
            "wait_s": self.wait_s,
        }


@dataclass
class TogetherResult:
    """A co-run: each job's figures, the combined throughput, and (asked for) the drawable run."""

    policy: str
    iterations: int
    jobs: list[JobOutcome]
    span_s: float  # from the start to the last task of any job
    window: tuple[float, float]  # where the steady state is measured: every job warm, none finished
    shared_devices: tuple[str, ...]
    memory: dict[str, tuple[float, tuple[float, ...]]]  # shared device -> (capacity, each job's peak)
    drawing: SimResult | None = None

    @property
    def combined_samples_per_s(self) -> float:
        """Every job's samples per second while they run together, added."""
        return sum(j.co_samples_per_s for j in self.jobs)

    @property
    def sequential_samples_per_s(self) -> float:
        """The jobs one after the other, one solo iteration each in turn (equal iteration counts)."""
        total = sum(j.solo_iteration_s for j in self.jobs)
        return sum(j.global_batch for j in self.jobs) / total if total > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "iterations": self.iterations,
            "steady_state": "from every job's first third of iterations done to the first job finished: "
            "the mean period of a job's iteration ends there (3 or more), else the window over the "
            "iterations' worth of compute it did there",
            "jobs": [j.to_json() for j in self.jobs],
            "combined_samples_per_s": self.combined_samples_per_s,
            "sequential_samples_per_s": self.sequential_samples_per_s,
            "span_s": self.span_s,
            "window_s": list(self.window),
            "shared_devices": list(self.shared_devices),
            "memory": {a: {"capacity_bytes": c, "peak_bytes": list(p)} for a, (c, p) in self.memory.items()},
        }


@dataclass
class TogetherRun:
    """The raw co-run: per job, each iteration's end; per task, its times (for drawing and tests)."""

    iteration_ends: list[list[float]]
    run: ExclusiveRun
    owner: list[tuple[int, int]]  # task -> (job, iteration)
    meta: list[Any]  # task -> the simulator's TaskInfo
    devices: list[str]  # device index -> address


def prepare_job(job: TogetherJob, *, iterations: int = 6) -> PreparedJob:
    """Check, compile and build one job; time one solo iteration and its solo steady state.

    A plan with no pipelines is an empty job (no task: what another job does beside nothing)."""
    if not job.plan.pipelines:
        nothing = SimResult(0.0, 0, 0.0, {}, [], [], "")
        return PreparedJob(job, CompiledPlan({}, [], []), Engine(), {}, nothing)
    if job.plan.sync == "sdpipe":
        raise HetplanError(
            "a plan with sync sdpipe cannot be co-simulated yet: its pipelines keep their own paces, and a "
            "job's iteration here is the end of every pipeline's",
            file=job.plan.file,
            field="sync",
        )
    with gc_paused():
        sim = simulate(job.plan, job.profile, job.cluster)  # checks the plan against its inputs
        check_memory(sim, job.plan)
        compiled = compile_plan(job.plan, len(job.profile.blocks))
        compiled = with_shared_groups(compiled, job.plan, job.profile.shared)
        costs = CostModel(whole_vocab_profile(job.plan, job.profile), job.cluster, optimizer=job.plan.optimizer)
        engine, _, capacity = _build(compiled, costs, job.cluster, job.plan)
    prepared = PreparedJob(job=job, compiled=compiled, engine=engine, capacity=capacity, sim=sim)
    if not prepared.empty:
        solo = run_together([prepared], [iterations], policy="first-come")  # one job: no policy applies
        _, periods, _ = steady_state(solo)
        prepared.solo_period_s = periods[0]
    return prepared


def _warmup(n: int) -> int:
    """Iterations left out at the start of an ``n``-iteration run: the first third (at least one)."""
    return max(1, -(-n // 3))


def steady_state(together: TogetherRun) -> tuple[tuple[float, float], list[float], list[float]]:
    """The measuring window, each job's steady-state iteration, and how many iterations it is measured
    over (module docstring).

    Inside ``[t0, t1]`` (every job past its warm-up, none finished), a job that ended at least three
    iterations there is measured by its iteration ends: the mean period between the first and the
    last of them (exact for a periodic schedule). A job that ended fewer (another starves it) is
    measured by its progress: the compute it did inside the window (the overlap of its forwards,
    backwards and optimizer steps with it) over its compute per iteration, the window's length over
    that. A window that does not open (a job still warming up when another has finished) is taken
    from the start. A one-iteration run is its iteration's end.
    """
    ends = together.iteration_ends
    active = [e for e in ends if e]
    if not active:
        return (0.0, 0.0), [0.0] * len(ends), [0.0] * len(ends)
    t1 = min(e[-1] for e in active)
    t0 = max(e[_warmup(len(e)) - 1] for e in active)
    if t0 >= t1:
        t0 = 0.0
    n_jobs = len(ends)
    work = [0.0] * n_jobs
    per_iteration = [0.0] * n_jobs
    start, end = together.run.start, together.run.end
    for t, (j, i) in enumerate(together.owner):
        if together.meta[t].kind not in _COMPUTE:
            continue
        lo, hi = start[t], end[t]
        if i == 0:
            per_iteration[j] += hi - lo  # every iteration's tasks last as long as the first's
        inside = min(hi, t1) - max(lo, t0)
        if inside > 0.0:
            work[j] += inside
    periods, done = [], []
    for j, e in enumerate(ends):
        inside_ends = [x for x in e if t0 <= x <= t1]
        if not e:
            periods.append(0.0)
            done.append(0.0)
        elif len(e) == 1:
            periods.append(e[0])
            done.append(1.0)
        elif len(inside_ends) >= 3:
            done.append(float(len(inside_ends) - 1))
            periods.append((inside_ends[-1] - inside_ends[0]) / done[-1])
        elif per_iteration[j] > 0.0 and work[j] > 0.0:
            done.append(work[j] / per_iteration[j])
            periods.append((t1 - t0) / done[-1])
        else:  # no compute to count: every iteration after the first
            done.append(float(len(e) - 1))
            periods.append((e[-1] - e[0]) / done[-1])
    return (t0, t1), periods, done


class _Template:
    """One job's iteration as lists parallel to its tasks, and the edges from one iteration to the next."""

    def __init__(self, prepared: PreparedJob, index: dict[str, int]) -> None:
        engine, groups = prepared.engine, prepared.compiled.groups
        n = len(engine)
        self.compute: list[int] = [-1] * n
        self.collective: list[tuple[int, ...]] = [()] * n
        self.ends_turn: list[bool] = [False] * n
        first: dict[str, int] = {}  # device -> its first compute task (or its step)
        ends: dict[str, list[int]] = {a: [] for a in prepared.compiled.programs}  # what ends its iteration
        starts: dict[str, list[int]] = {a: [] for a in prepared.compiled.programs}  # what must wait for that
        for t, info in enumerate(engine.meta):
            if info.kind in _COMPUTE:
                self.compute[t] = index[info.device]
                first.setdefault(info.device, t)
                if info.kind == "step":
                    self.ends_turn[t] = True
                    ends[info.device].append(t)
            elif info.kind == "allreduce":
                members = tuple(dict.fromkeys(groups[info.group].devices))
                self.collective[t] = tuple(index[a] for a in members)
                for a in members:
                    ends[a].append(t)
                    starts[a].append(t)
            elif info.kind == "send":
                starts[info.peer].append(t)  # the receive is posted once the receiver's last step is done
        pairs: dict[tuple[int, int], None] = {}
        for address in prepared.compiled.programs:
            heads = ([first[address]] if address in first else []) + starts[address]
            for a in ends[address]:
                for b in heads:
                    pairs[(a, b)] = None
        self.carry = list(pairs)
        self.edges = [(a, b, off) for a in range(n) for b, off in engine.succ[a]]
        self.n = n


def run_together(prepared: Sequence[PreparedJob], counts: Sequence[int], *, policy: str) -> TogetherRun:
    """Run ``counts[j]`` iterations of each job at once on their shared devices."""
    devices: dict[str, int] = {}
    for p in prepared:
        order = {d.address: i for i, d in enumerate(p.job.cluster.devices)}
        for address in sorted(p.devices, key=order.__getitem__):
            devices.setdefault(address, len(devices))
    merged = Engine()
    compute: list[int] = []
    collective: list[tuple[int, ...]] = []
    ends_turn: list[bool] = []
    job_of: list[int] = []
    owner: list[tuple[int, int]] = []
    capacity: dict[Any, float] = {}
    ranges: list[list[range]] = []
    for j, (p, count) in enumerate(zip(prepared, counts, strict=True)):
        for key, value in p.capacity.items():
            capacity.setdefault(key, value)  # one cluster: the first job's figures
        template = _Template(p, devices)
        blocks: list[range] = []
        for i in range(count if template.n else 0):
            engine = p.engine
            base = len(merged)
            merged.add_many(engine.duration, engine.flow, engine.meta)
            for a, b, off in template.edges:
                merged.add_edge(base + a, base + b, offset=off)
            if blocks:
                previous = blocks[-1].start
                for a, b in template.carry:
                    merged.add_edge(previous + a, base + b)
            compute.extend(template.compute)
            collective.extend(template.collective)
            ends_turn.extend(template.ends_turn)
            job_of.extend([j] * template.n)
            owner.extend([(j, i)] * template.n)
            blocks.append(range(base, base + template.n))
        ranges.append(blocks)
    sharing = Sharing(compute, collective, job_of, ends_turn, n_devices=len(devices), n_jobs=len(prepared))
    with gc_paused():
        run = run_exclusive(merged, capacity, sharing, policy)
    ends = [[max(run.end[r.start : r.stop]) for r in blocks] for blocks in ranges]
    return TogetherRun(iteration_ends=ends, run=run, owner=owner, meta=merged.meta, devices=list(devices))


def iteration_counts(prepared: Sequence[PreparedJob], iterations: int, periods: Sequence[float] = ()) -> list[int]:
    """Iterations per job so that they run side by side over about the same span: ``iterations``
    periods of the job with the longest period (``periods``, else each job's solo steady state), the
    others as many as fit in that span; within :data:`MAX_TASKS` tasks in all (the fastest jobs give
    up iterations first)."""
    periods = list(periods) or [p.solo_period_s for p in prepared]
    span = iterations * max(periods, default=0.0)
    counts = [
        1 if p.empty or period <= 0 else max(iterations, math.ceil(span / period - 1e-9))
        for p, period in zip(prepared, periods, strict=True)
    ]
    sizes = [len(p.engine) for p in prepared]
    while sum(c * n for c, n in zip(counts, sizes, strict=True)) > MAX_TASKS:
        j = max(range(len(counts)), key=lambda k: (counts[k] * sizes[k], -k))
        if counts[j] <= iterations:
            break
        counts[j] = max(iterations, counts[j] * 9 // 10)
    return counts


def simulate_together(
    jobs: Sequence[TogetherJob],
    *,
    policy: str = "first-come",
    iterations: int = 6,
    timeline: bool = False,
    prepared: Sequence[PreparedJob] | None = None,
) -> TogetherResult:
    """Co-simulate ``jobs`` (see the module docstring); ``prepared`` reuses :func:`prepare_job` work."""
    if policy not in POLICIES:
        raise HetplanError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}", field="--policy")
    if iterations < 1:
        raise HetplanError(f"expected at least 1 iteration, got {iterations}", field="--iterations")
    check_same_cluster(jobs)
    if prepared is None:
        prepared = [prepare_job(job, iterations=iterations) for job in jobs]
    memory = check_memory_together(prepared)
    counts = iteration_counts(prepared, iterations)
    together = run_together(prepared, counts, policy=policy)
    (t0, t1), periods, done = steady_state(together)
    short = [d < 2.0 for p, d in zip(prepared, done, strict=True) if not p.empty]
    if iterations >= 3 and (any(short) or t1 - t0 < max(periods, default=0.0)):
        # together the jobs keep other paces than alone: run again, counted by their paces together
        balanced = iteration_counts(prepared, iterations, periods)
        if balanced != counts:
            together = run_together(prepared, balanced, policy=policy)
    return measure(prepared, together, policy=policy, iterations=iterations, memory=memory, timeline=timeline)


def measure(
    prepared: Sequence[PreparedJob],
    together: TogetherRun,
    *,
    policy: str,
    iterations: int,
    memory: dict[str, tuple[float, tuple[float, ...]]],
    timeline: bool = False,
) -> TogetherResult:
    """Each job's steady state inside the window every job runs in (module docstring)."""
    window, periods, done = steady_state(together)
    waits = [0.0] * len(prepared)
    run = together.run
    for t, (j, _) in enumerate(together.owner):
        if run.waited[t] > 0.0 and together.meta[t].kind in _COMPUTE:
            waits[j] += run.waited[t]
    outcomes = []
    for j, p in enumerate(prepared):
        ends = together.iteration_ends[j]
        outcomes.append(
            JobOutcome(
                label=p.job.label,
                file=p.job.plan.file or "",
                global_batch=p.job.plan.global_batch if not p.empty else 0,
                devices=p.devices,
                iteration_s=p.sim.iteration_s,
                solo_iteration_s=p.solo_period_s,
                co_iteration_s=periods[j],
                iterations=len(ends),
                measured=done[j],
                wait_s=waits[j] / len(ends) if ends else 0.0,
            )
        )
    used: dict[str, int] = {}
    for p in prepared:
        for address in p.devices:
            used[address] = used.get(address, 0) + 1
    result = TogetherResult(
        policy=policy,
        iterations=iterations,
        jobs=outcomes,
        span_s=run.makespan,
        window=window,
        shared_devices=tuple(a for a in together.devices if used.get(a, 0) > 1),
        memory=memory,
    )
    if timeline:
        from hetplan.simulate.together_draw import drawing

        result.drawing = drawing(prepared, together, result)
    return result

"""The planner's search: from a profile, a cluster and a global batch to the plans that train fastest.

    searched = search_plans(profile, cluster, PlanOptions(global_batch=512))
    result = best_plan(searched, baselines, profile, cluster, opts)   # or search_only(...)

:func:`hetplan.solve.training.plan_training` runs the whole planner: this search, then the
baselines (:mod:`hetplan.solve.baselines`, which may run this search themselves), then the choice.

Search, in order:

1. **Structures** (:mod:`hetplan.solve.structures`): which devices form which pipeline, in which order.
2. **Per structure and micro-batch size**: the exact partition DP for each distinct pipeline
   (cached: identical pipelines are solved once), batch shares by water-filling on each pipeline's
   closed-form time (Stannis: a pipeline's share follows its speed), an estimate of the exposed
   gradient all-reduce. This closed form only *ranks*; it is never reported.
3. **Scoring**: the best candidates by that estimate, and every baseline, are simulated; the fastest
   simulated plan that fits in memory wins (ties go to the earlier candidate: deterministic).
4. **Refinement with the simulator**: startup micro-batch splitting, then moving cuts and samples one
   step at a time while the simulated iteration improves.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hetplan.contracts.cluster import Cluster, Link
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage, check_dtype_supported, check_plan
from hetplan.errors import HetplanError
from hetplan.schedule.compile import compile_plan
from hetplan.simulate.costs import CostModel
from hetplan.simulate.memory import plan_memory
from hetplan.simulate.simulator import SimResult, simulate
from hetplan.solve.batching import allocate_batch, micro_batch_list, startup_splits
from hetplan.solve.bounds import compute_lower_bound
from hetplan.solve.partition import Partition, Slot, partition
from hetplan.solve.structures import EXHAUSTIVE_DEVICES, EXHAUSTIVE_STRUCTURES, Structure, candidate_structures
from hetplan.solve.tables import CostTables

__all__ = [
    "Candidate",
    "PlanOptions",
    "PlanResult",
    "Searched",
    "best_plan",
    "evaluate_structure",
    "search_only",
    "search_plans",
    "simulate_or_none",
]

_NO_LIMIT = 10**9
_LOCAL_SEARCH_DEVICES = 8  # up to this many devices, refine with simulator-driven hill-climbing
_REFINED_CANDIDATES = 24  # ... starting from this many of the best simulated candidates,
_FEW_PIPELINES = 16  # up to this many pipelines, try every startup-splitting variant
_REFINE_TASKS = 120_000  # ... until this many simulated tasks are spent (about 1-2 s here)


@dataclass(frozen=True)
class PlanOptions:
    global_batch: int
    schedule: str = "1f1b"
    optimizer: str = "adam"
    micro_batch_sizes: tuple[int, ...] | None = None  # None: powers of two up to 64
    max_stages: int = 16
    top_k: int | None = None  # candidates simulated; None: by cluster size
    refine: bool = True
    baselines: bool = True


@dataclass
class Candidate:
    label: str
    plan: Plan
    estimate: float
    sim: SimResult | None = None


@dataclass
class PlanResult:
    plan: Plan
    sim: SimResult
    lower_bound_s: float
    label: str = ""
    candidates: list[Candidate] = field(default_factory=list)
    baselines: dict[str, Candidate | None] = field(default_factory=dict)
    structures: int = 0


def _slowest_link(cluster: Cluster, a: Slot, b: Slot) -> Link:
    links = [cluster.link(x, y) for x in a.devices for y in b.devices]
    return min(links, key=lambda link: (link.bandwidth, -link.latency))


def _signature(cluster: Cluster, slots: tuple[Slot, ...]) -> tuple:
    kinds = tuple((tuple(d.type.name for d in s.devices), s.shares) for s in slots)
    pairs = itertools.pairwise(slots)
    links = tuple((lk.bandwidth, lk.latency) for lk in (_slowest_link(cluster, a, b) for a, b in pairs))
    return kinds, links


def _pipeline_time(part: Partition, m: int) -> Callable[[int], float]:
    def time(b: int) -> float:
        if b <= m:
            return part.total * b / m
        return (math.ceil(b / m) - 1) * part.bottleneck + part.total

    return time


def _to_plan(structure: Structure, parts: list[Partition], shares: list[int], m: int, opts: PlanOptions) -> Plan:
    pipelines = []
    for slots, part, batch in zip(structure.pipelines, parts, shares, strict=True):
        stages = tuple(
            Stage(part.cuts[s], part.cuts[s + 1], tuple(d.address for d in slot.devices), slot.shares)
            for s, slot in enumerate(slots)
        )
        pipelines.append(Pipeline(batch, micro_batch_list(batch, m), stages))
    return Plan(global_batch=opts.global_batch, pipelines=pipelines, schedule=opts.schedule, optimizer=opts.optimizer)


class _Search:
    """State shared by one planning run: tables, caches, options."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, opts: PlanOptions) -> None:
        self.profile, self.cluster, self.opts = profile, cluster, opts
        self.tables = CostTables(profile, cluster, optimizer=opts.optimizer)
        self.costs = CostModel(profile, cluster, optimizer=opts.optimizer)
        self.cache: dict[tuple, Partition | None] = {}
        sizes = opts.micro_batch_sizes or tuple(2**k for k in range(7))
        self.sizes = tuple(sorted(set(sizes)))

    def partition_for(self, slots: tuple[Slot, ...], m: int, n_micro: int) -> Partition | None:
        """The best cuts for one pipeline running ``n_micro`` micro-batches of ``m`` (cached)."""
        held = n_micro if self.opts.schedule == "gpipe" else _NO_LIMIT
        key = (_signature(self.cluster, slots), m, held, n_micro)
        if key not in self.cache:
            links = [_slowest_link(self.cluster, a, b) for a, b in itertools.pairwise(slots)]
            self.cache[key] = partition(
                self.tables,
                list(slots),
                m=m,
                n_micro=held,
                schedule=self.opts.schedule,
                links=links,
                objective_micro=n_micro,
            )
        return self.cache[key]

    def exposed_sync(self, structure: Structure, parts: list[Partition]) -> float:
        """All-reduce of the blocks every first stage holds: their gradients are ready last."""
        if len(structure.pipelines) == 1 and len(structure.pipelines[0][0].devices) == 1:
            return 0.0
        end = min(p.cuts[1] for p in parts)
        devices = [d for slots in structure.pipelines for d in slots[0].devices]
        return self.costs.allreduce(self.costs.gradient_bytes(tuple(range(end))), devices)

    def evaluate(self, structure: Structure) -> Candidate | None:
        n_pipes = len(structure.pipelines)
        batch = self.opts.global_batch
        if n_pipes > batch:
            return None
        best: Candidate | None = None
        for m in self.sizes:
            if m > max(1, batch // n_pipes) and m != self.sizes[0]:
                break
            n_micro = math.ceil(batch / n_pipes / m)
            parts = [self.partition_for(slots, m, n_micro) for slots in structure.pipelines]
            if any(p is None for p in parts):
                continue
            shares = allocate_batch(batch, [_pipeline_time(p, m) for p in parts])
            # re-cut each pipeline for the number of micro-batches it really got, then re-share
            exact = [
                self.partition_for(slots, m, math.ceil(b / m))
                for slots, b in zip(structure.pipelines, shares, strict=True)
            ]
            if all(p is not None for p in exact):
                parts = exact
                shares = allocate_batch(batch, [_pipeline_time(p, m) for p in parts])
            estimate = max(_pipeline_time(p, m)(b) for p, b in zip(parts, shares, strict=True))
            estimate += self.exposed_sync(structure, parts)
            if best is None or estimate < best.estimate:
                best = Candidate(structure.label, _to_plan(structure, parts, shares, m, self.opts), estimate)
        return best


def simulate_or_none(plan: Plan, profile: ModelProfile, cluster: Cluster) -> SimResult | None:
    """The simulated iteration, or None if a device runs out of memory (checked before simulating:
    the memory walk needs only the compiled action lists, the event run is the expensive part)."""
    check_plan(plan, cluster, profile)
    compiled = compile_plan(plan, len(profile.blocks))
    memory = plan_memory(compiled, profile, cluster, optimizer=plan.optimizer, dtype=plan.dtype)
    if not all(use.fits for use in memory.values()):
        return None
    return simulate(plan, profile, cluster, compiled=compiled)


def evaluate_structure(
    profile: ModelProfile, cluster: Cluster, structure: Structure, opts: PlanOptions
) -> Candidate | None:
    """The best candidate plan for one structure (used by tests and baselines)."""
    return _Search(profile, cluster, opts).evaluate(structure)


def _with_micro(plan: Plan, index: int, micro: tuple[int, ...]) -> Plan:
    pipes = list(plan.pipelines)
    p = pipes[index]
    pipes[index] = Pipeline(p.batch, micro, p.stages)
    return _replace_pipelines(plan, pipes)


def _replace_pipelines(plan: Plan, pipelines: list[Pipeline]) -> Plan:
    return Plan(global_batch=plan.global_batch, pipelines=pipelines, schedule=plan.schedule, optimizer=plan.optimizer)


def _moves(plan: Plan, m_of: list[int]) -> list[Plan]:
    """Neighbouring plans: one cut moved by one block, or one micro-batch of samples moved."""
    out = []
    for pi, p in enumerate(plan.pipelines):
        for si in range(1, len(p.stages)):
            for delta in (-1, 1):
                cut = p.stages[si].start + delta
                if p.stages[si - 1].start < cut < p.stages[si].end:
                    stages = list(p.stages)
                    a, b = stages[si - 1], stages[si]
                    stages[si - 1] = Stage(a.start, cut, a.devices, a.shares)
                    stages[si] = Stage(cut, b.end, b.devices, b.shares)
                    pipes = list(plan.pipelines)
                    pipes[pi] = Pipeline(p.batch, p.micro_batches, tuple(stages))
                    out.append(_replace_pipelines(plan, pipes))
    for src in range(len(plan.pipelines)):
        for dst in range(len(plan.pipelines)):
            if src == dst or plan.pipelines[src].batch <= 1:
                continue
            pipes = list(plan.pipelines)
            s, d = pipes[src], pipes[dst]
            pipes[src] = Pipeline(s.batch - 1, micro_batch_list(s.batch - 1, m_of[src]), s.stages)
            pipes[dst] = Pipeline(d.batch + 1, micro_batch_list(d.batch + 1, m_of[dst]), d.stages)
            out.append(_replace_pipelines(plan, pipes))
    return out


def _refine(
    best: Candidate, profile: ModelProfile, cluster: Cluster, *, local_search: bool, budget: list[int] | None = None
) -> Candidate:
    """Startup splitting, then (small plans) hill-climbing on cuts and batch shares.

    Startup splitting is tried per pipeline on small plans; with many pipelines each variant is
    applied to every pipeline at once (one simulation per variant, not per pipeline).
    """
    assert best.sim is not None
    plan, sim = best.plan, best.sim
    trials: list[Plan] = []
    if local_search:
        for pi, p in enumerate(plan.pipelines):
            trials += [_with_micro(plan, pi, v) for v in startup_splits(p.micro_batches)]
    else:
        # the k-th variant of every pipeline's own list, together; on large plans the fill is a small
        # share of the iteration, so only the first variant (halves) is worth its simulation
        for k in range(3 if len(plan.pipelines) <= _FEW_PIPELINES else 1):
            pipes = []
            for p in plan.pipelines:
                variants = startup_splits(p.micro_batches)
                pipes.append(Pipeline(p.batch, variants[k], p.stages) if k < len(variants) else p)
            if any(a is not b for a, b in zip(pipes, plan.pipelines, strict=True)):
                trials.append(_replace_pipelines(plan, pipes))
    for trial in trials:
        result = simulate_or_none(trial, profile, cluster)
        if result is not None and result.iteration_s < sim.iteration_s * (1 - 1e-9):
            plan, sim = trial, result
    if local_search:
        m_of = [max(p.micro_batches) for p in plan.pipelines]
        budget = budget if budget is not None else [_REFINE_TASKS]
        for _ in range(50):  # steepest descent: the best neighbour each round (first-improvement stalls early)
            step_plan, step_sim = plan, sim
            if budget[0] <= 0:
                break
            for trial in _moves(plan, m_of):
                result = simulate_or_none(trial, profile, cluster)
                budget[0] -= sim.n_tasks
                if result is not None and result.iteration_s < step_sim.iteration_s * (1 - 1e-9):
                    step_plan, step_sim = trial, result
            if step_plan is plan:
                break
            plan, sim = step_plan, step_sim
    return Candidate(best.label, plan, best.estimate, sim)


def _infeasible(profile: ModelProfile, cluster: Cluster, opts: PlanOptions, tables: CostTables) -> HetplanError:
    """Say what would make the model fit."""
    from hetplan.units import format_bytes

    n_devices = len(cluster.devices)
    largest = max(cluster.devices, key=lambda d: d.type.memory)
    static = tables.static_memory(0, tables.n)
    per_device = static / n_devices
    if opts.global_batch < 1:
        return HetplanError("the global batch must be at least 1", field="--batch")
    hints = []
    if per_device + 0.0 > largest.type.memory * 0.9:
        hints.append(
            f"more devices (weights, gradients and {opts.optimizer} state alone need {format_bytes(static)}, "
            f"{format_bytes(per_device)} per device even split over all {n_devices})"
        )
    if opts.optimizer != "sgd":
        hints.append("a lower-memory optimizer (--optimizer sgd)")
    hints.append("smaller micro-batches (--micro-batch-sizes 1)")
    return HetplanError(
        f"no plan fits in memory on cluster {cluster.name!r} with global batch {opts.global_batch}; try "
        + ", or ".join(hints),
        field="plan",
    )


@dataclass
class Searched:
    """What the search found before baselines join: the scored candidates and the search state."""

    search: _Search
    structures: int
    scored: list[Candidate]


def search_plans(
    profile: ModelProfile,
    cluster: Cluster,
    opts: PlanOptions,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> Searched:
    """Steps 1-3 of the module docstring: every structure's best candidate, the best few simulated."""
    search = _Search(profile, cluster, opts)
    check_dtype_supported(cluster, profile.dtype, file=cluster.file, field="nodes[].devices[].type")
    for device_type in cluster.device_types.values():
        profile.time_scale(device_type)  # a missing device type is an error before any search
    structures = list(
        candidate_structures(
            cluster, n_blocks=len(profile.blocks), max_stages=opts.max_stages, max_pipelines=opts.global_batch
        )
    )
    candidates: list[Candidate] = []
    for i, structure in enumerate(structures):
        candidate = search.evaluate(structure)
        if candidate is not None:
            candidates.append(candidate)
        if progress:
            progress(i + 1, len(structures))
    candidates.sort(key=lambda c: c.estimate)  # stable: ties keep enumeration order
    # exhaustive structures are few enough to simulate every one; otherwise the estimate prunes
    if opts.top_k:
        top_k = opts.top_k
    elif len(cluster.devices) <= EXHAUSTIVE_DEVICES and len(structures) <= EXHAUSTIVE_STRUCTURES:
        top_k = len(candidates)
    else:
        top_k = 8 if len(cluster.devices) <= 16 else 3
    scored: list[Candidate] = []
    seen: set[str] = set()
    for c in candidates:
        key = str(c.plan.to_dict()["pipelines"])
        if key in seen:
            continue
        seen.add(key)
        c.sim = simulate_or_none(c.plan, profile, cluster)
        if c.sim is not None:
            scored.append(c)
        if len(scored) >= top_k:
            break
    return Searched(search=search, structures=len(structures), scored=scored)


def best_plan(
    searched: Searched,
    baselines: dict[str, Candidate | None],
    profile: ModelProfile,
    cluster: Cluster,
    opts: PlanOptions,
) -> PlanResult:
    """Step 4: the fastest of the searched candidates and the baselines, refined, with its bound."""
    pool = searched.scored + [b for b in baselines.values() if b is not None and b.sim is not None]
    if not pool:
        raise _infeasible(profile, cluster, opts, searched.search.tables)
    best = min(pool, key=lambda c: c.sim.iteration_s)
    if opts.refine:
        # small clusters: hill-climb from the few best simulated candidates, not only the winner; the
        # closed form that picked each one's cuts and shares can misjudge which structure wins
        small = len(cluster.devices) <= _LOCAL_SEARCH_DEVICES
        ranked = sorted(pool, key=lambda c: c.sim.iteration_s)[: _REFINED_CANDIDATES if small else 1]
        budget = [_REFINE_TASKS]  # simulated tasks, shared: deterministic, unlike a time limit
        refined = [_refine(c, profile, cluster, local_search=small, budget=budget) for c in ranked]
        best = min(refined, key=lambda c: c.sim.iteration_s)
    search = searched.search
    lower = compute_lower_bound(search.tables, cluster, opts.global_batch, list(search.sizes))
    return PlanResult(
        plan=best.plan,
        sim=best.sim,
        lower_bound_s=lower,
        label=best.label,
        candidates=searched.scored,
        baselines=baselines,
        structures=searched.structures,
    )


def search_only(profile: ModelProfile, cluster: Cluster, opts: PlanOptions) -> PlanResult:
    """The planner without baselines (what a baseline that runs a planner of its own calls)."""
    return best_plan(search_plans(profile, cluster, opts), {}, profile, cluster, opts)


def plan_details(result: PlanResult, cluster: Cluster) -> dict[str, Any]:
    """The plan file's ``details``: bound, gap, idle devices, runners-up."""
    used = set(result.plan.all_devices())
    idle = [d.address for d in cluster.devices if d.address not in used]
    best = result.sim.iteration_s
    runners = []
    for c in sorted(result.candidates, key=lambda c: c.sim.iteration_s):
        if c.plan.to_dict()["pipelines"] == result.plan.to_dict()["pipelines"]:
            continue
        runners.append(
            {
                "structure": c.label,
                "iteration_s": round(c.sim.iteration_s, 9),
                "slower_by": round(c.sim.iteration_s / best - 1, 6),
                "bottleneck": c.sim.bottleneck,
            }
        )
        if len(runners) >= 5:
            break
    return {
        "structure": result.label,
        "lower_bound_s": round(result.lower_bound_s, 9),
        "gap_to_lower_bound": round(best / result.lower_bound_s - 1, 6) if result.lower_bound_s > 0 else None,
        "structures_searched": result.structures,
        "idle_devices": idle,
        "runners_up": runners,
    }

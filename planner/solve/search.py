"""The planner's search: from a profile, a cluster and a global batch to the plans that train fastest.

    searched = search_plans(profile, cluster, PlanOptions(global_batch=512))
    result = best_plan(searched, baselines, profile, cluster, opts)   # or search_only(...)

:func:`hetplan.solve.training.plan_training` runs the whole planner: this search, then the
baselines (:mod:`hetplan.solve.baselines`, which may run this search themselves), then the choice.

Search, in order:

1. **Structures** (:mod:`hetplan.solve.structures`): which devices form which pipeline, in which order.
2. **Per structure**: for each pipeline and micro-batch size, the exact partition DP (cached:
   identical pipelines are solved once), which also picks each stage's tensor-parallel degree and
   recomputation (:mod:`hetplan.solve.partition`); batch shares by water-filling on each pipeline's
   closed-form time, each pipeline at the micro-batch size that is fastest for its share (Stannis: a
   pipeline's share follows its speed; pipelines may differ in micro-batch size); an estimate of the
   exposed gradient all-reduce. Every holder of a block must use one TP degree: when the pipelines'
   own choices disagree, the structure is solved again with each block's degree fixed (to the
   largest pipeline's choice, and to each single degree) and the best agreeing result is kept.
   ZeRO-1 is a plan-level choice: tried where memory is tight (no plan fits, or a faster option of
   some stage did not), kept only when the simulator finds it faster. This closed form only
   *ranks*; it is never reported.
3. **Scoring**: the best candidates by that estimate, and every baseline, are simulated; the fastest
   simulated plan that fits in memory wins (ties go to the earlier candidate: deterministic).
4. **Refinement with the simulator**: startup micro-batch splitting, then moving cuts and samples one
   step at a time while the simulated iteration improves.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

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
from hetplan.solve.explain import explain_plan
from hetplan.solve.partition import _NO_PRUNE_LIMIT, Partition, Slot, SlotCosts, default_tp_link, partition
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
    sync: str = "allreduce"  # the plan's sync mode: candidates are re-scored under it (training.py)
    sync_options: dict[str, float | int] = field(default_factory=dict)


@dataclass
class Candidate:
    label: str
    plan: Plan
    estimate: float
    sim: SimResult | None = None
    tight: bool = False  # some stage's faster option did not fit in memory


@dataclass
class PlanResult:
    plan: Plan
    sim: SimResult
    lower_bound_s: float
    label: str = ""
    candidates: list[Candidate] = field(default_factory=list)
    baselines: dict[str, Candidate | None] = field(default_factory=dict)
    structures: int = 0
    explanations: dict[str, Any] = field(default_factory=dict)  # why each stage's TP / recompute, the ZeRO choice


def _slowest_link(cluster: Cluster, a: Slot, b: Slot) -> Link:
    links = [cluster.link(x, y) for x in a.devices for y in b.devices]
    return min(links, key=lambda link: (link.bandwidth, -link.latency))


def _signature(cluster: Cluster, slots: tuple[Slot, ...]) -> tuple:
    kinds = tuple((tuple(d.type.name for d in s.devices), s.shares) for s in slots)
    pairs = itertools.pairwise(slots)
    links = tuple((lk.bandwidth, lk.latency) for lk in (_slowest_link(cluster, a, b) for a, b in pairs))
    return kinds, links


def _pipeline_time(part: Partition, m: int) -> Callable[[int], float]:
    """Closed-form time of ``b`` samples as :func:`micro_batch_list` splits them: full micro-batches
    of ``m`` at the bottleneck rate after the first fills the pipeline, and a smaller remainder
    micro-batch priced in proportion to its size (as a whole one where a stage is replicated: a
    small micro-batch leaves replicas idle, the busy ones take as long)."""

    def time(b: int) -> float:
        if b <= m:
            return part.total * (1.0 if part.replicated else b / m)
        full, rest = divmod(b, m)
        # a replicated stage runs a small remainder on fewer replicas, no faster per replica
        share = (1.0 if rest else 0.0) if part.replicated else rest / m
        return (full - 1) * part.bottleneck + part.total + share * part.bottleneck

    return time


def _fastest(options: list[tuple[Partition, int]], batch: int) -> tuple[Callable[[int], float], np.ndarray]:
    """A pipeline's time for ``b`` samples (up to ``batch``) at whichever micro-batch size is
    fastest for ``b`` (the first of equals), and that choice's index, per ``b``: one table."""
    b = np.arange(batch + 2, dtype=float)
    smallest = min(m for _, m in options)
    rows = []
    for p, m in options:
        full, rest = np.floor(b / m), np.mod(b, m)
        share = (rest > 0).astype(float) if p.replicated else rest / m  # as _pipeline_time
        small = p.total * (np.ones_like(b) if p.replicated else b / m)
        row = np.where(b <= m, small, (full - 1) * p.bottleneck + p.total + share * p.bottleneck)
        if m > smallest:  # fewer samples than m run as one smaller micro-batch: a smaller size prices that
            row[b < m] = np.inf
        rows.append(row)
    table = np.array(rows)
    pick = np.argmin(table, axis=0)
    best = table[pick, np.arange(batch + 2)]
    return (lambda k: float(best[k])), pick


def _to_plan(
    structure: Structure, parts: list[Partition], shares: list[int], sizes: list[int], opts: PlanOptions, zero: int
) -> Plan:
    pipelines = []
    for slots, part, batch, m in zip(structure.pipelines, parts, shares, sizes, strict=True):
        stages = []
        for s, slot in enumerate(slots):
            tp, recompute = part.option(s)
            stages.append(
                Stage(
                    part.cuts[s],
                    part.cuts[s + 1],
                    tuple(d.address for d in slot.devices),
                    slot.replica_shares(tp),
                    tensor_parallel=tp,
                    recompute=recompute,
                )
            )
        pipelines.append(Pipeline(batch, micro_batch_list(batch, m), tuple(stages)))
    return Plan(
        global_batch=opts.global_batch,
        pipelines=pipelines,
        schedule=opts.schedule,
        optimizer=opts.optimizer,
        zero=zero,
    )


def block_degrees(plan: Plan) -> dict[int, int] | None:
    """Each block's TP degree, or None where two holders of a block disagree (the contract forbids it)."""
    degree: dict[int, int] = {}
    for p in plan.pipelines:
        for s in p.stages:
            for b in range(s.start, s.end):
                if degree.setdefault(b, s.tensor_parallel) != s.tensor_parallel:
                    return None
    return degree


class _Search:
    """State shared by one planning run: tables, caches, options."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, opts: PlanOptions) -> None:
        self.profile, self.cluster, self.opts = profile, cluster, opts
        self.tables = CostTables(profile, cluster, optimizer=opts.optimizer)
        self.costs = CostModel(profile, cluster, optimizer=opts.optimizer)
        self.slot_costs = SlotCosts(self.tables, default_tp_link(self.tables))
        self.cache: dict[tuple, Partition | None] = {}
        self.signatures: dict[tuple, tuple] = {}
        sizes = opts.micro_batch_sizes or tuple(2**k for k in range(7))
        self.sizes = tuple(sorted(set(sizes)))
        n = self.tables.n
        self.degrees = tuple(sorted({t for b in range(n) for t in self.tables.tp_options(b, b + 1)}))

    def signature(self, slots: tuple[Slot, ...]) -> tuple:
        """What a pipeline's partition depends on (types, shares, links), cached by its devices."""
        key = tuple(tuple(d.address for d in s.devices) for s in slots)
        if key not in self.signatures:
            self.signatures[key] = _signature(self.cluster, slots)
        return self.signatures[key]

    def partition_for(
        self,
        slots: tuple[Slot, ...],
        m: int,
        n_micro: int,
        *,
        pipelines: int = 1,
        zero: bool = False,
        allowed: tuple[frozenset[int], ...] | None = None,
        signature: tuple | None = None,
    ) -> Partition | None:
        """The best cuts and stage options for one pipeline running ``n_micro`` micro-batches of ``m`` (cached)."""
        signature = signature or self.signature(slots)
        if self.opts.schedule != "gpipe":
            # 1F1B: past max(stages, _NO_PRUNE_LIMIT + 1) micro-batches neither the memory a stage
            # holds nor the DP's (lexicographic) objective changes: one answer for all those counts
            n_micro = min(n_micro, max(len(slots), _NO_PRUNE_LIMIT + 1))
        key = (signature, m, n_micro, pipelines, zero, allowed)
        if key not in self.cache:
            links = [_slowest_link(self.cluster, a, b) for a, b in itertools.pairwise(slots)]
            self.cache[key] = partition(
                self.tables,
                list(slots),
                m=m,
                n_micro=n_micro,  # a stage holds at most this many (1F1B: min(stages left, n_micro))
                schedule=self.opts.schedule,
                links=links,
                objective_micro=n_micro,
                costs=self.slot_costs,
                pipelines=pipelines,
                zero=zero,
                allowed=allowed,
            )
        return self.cache[key]

    def exposed_sync(self, structure: Structure, parts: list[Partition]) -> float:
        """All-reduce of the blocks every first stage holds: their gradients are ready last."""
        if len(structure.pipelines) == 1 and len(structure.pipelines[0][0].devices) == 1:
            return 0.0
        end = min(p.cuts[1] for p in parts)
        devices = [d for slots in structure.pipelines for d in slots[0].devices]
        tp = max(p.option(0)[0] for p in parts)
        return self.costs.allreduce(self.costs.gradient_bytes(tuple(range(end))) / tp, devices[::tp])

    def evaluate(self, structure: Structure) -> list[Candidate]:
        """The structure's best candidate without ZeRO, and with it where memory is tight."""
        out: list[Candidate] = []
        plain = self._agreeing(structure, zero=0)
        if plain is not None:
            out.append(plain)
            if len(self.cluster.devices) <= _LOCAL_SEARCH_DEVICES:
                # small clusters: every pipeline at each one micro-batch size too, cut for it; the
                # closed form that picks the size ignores the overlap the simulator sees (a size with
                # more, smaller micro-batches can win by its pipelining)
                for m in self.sizes:
                    alt = self._evaluate(structure, zero=0, allowed=None, only_size=m)
                    if alt is None or alt.plan.pipelines == plain.plan.pipelines:
                        continue
                    if block_degrees(alt.plan) is None:  # holders disagree on a degree: as _agreeing does
                        alt = self._agreeing(structure, zero=0, only_size=m)
                    if alt is not None:
                        out.append(alt)
        holders = len(structure.pipelines) > 1 or any(len(s.devices) > 1 for p in structure.pipelines for s in p)
        if holders and (plain is None or plain.tight):
            zero = self._agreeing(structure, zero=1)
            if zero is not None:
                out.append(zero)
        return out

    def _agreeing(self, structure: Structure, *, zero: int, only_size: int | None = None) -> Candidate | None:
        """The best candidate in which every holder of a block uses one TP degree."""
        free = self._evaluate(structure, zero=zero, allowed=None, only_size=only_size)
        if free is None or len(self.degrees) == 1 or block_degrees(free.plan) is not None:
            return free
        n = self.tables.n
        largest = max(free.plan.pipelines, key=lambda p: p.batch)
        of_largest = {b: s.tensor_parallel for s in largest.stages for b in range(s.start, s.end)}
        maps = [tuple(frozenset({of_largest[b]}) for b in range(n))]
        for t in self.degrees:
            maps.append(tuple(frozenset({t if t in self.tables.tp_options(b, b + 1) else 1}) for b in range(n)))
        best: Candidate | None = None
        for allowed in maps:
            c = self._evaluate(structure, zero=zero, allowed=allowed, only_size=only_size)
            if c is not None and block_degrees(c.plan) is not None and (best is None or c.estimate < best.estimate):
                best = c
        return best

    def _evaluate(
        self,
        structure: Structure,
        *,
        zero: int,
        allowed: tuple[frozenset[int], ...] | None,
        only_size: int | None = None,
    ) -> Candidate | None:
        n_pipes = len(structure.pipelines)
        batch = self.opts.global_batch
        if n_pipes > batch:
            return None
        # a pipeline may take more than its even share: sizes up to twice that (and what fits a share)
        even = math.ceil(batch / n_pipes)
        sizes = [m for i, m in enumerate(self.sizes) if i == 0 or m <= min(2 * even, batch - n_pipes + 1)]
        if only_size is not None:
            if only_size not in sizes:
                return None
            sizes = [only_size]
        n_micro = {m: math.ceil(batch / n_pipes / m) for m in sizes}
        signatures = [self.signature(slots) for slots in structure.pipelines]
        options: dict[tuple, tuple] = {}  # identical pipelines are solved and tabulated once
        for slots, sig in zip(structure.pipelines, signatures, strict=True):
            if sig in options:
                continue
            found = []
            for m in sizes:
                part = self.partition_for(
                    slots, m, n_micro[m], pipelines=n_pipes, zero=bool(zero), allowed=allowed, signature=sig
                )
                if part is not None:
                    found.append((part, m))
            if not found:
                return None
            options[sig] = (found, *_fastest(found, batch))  # (only_size: the one size)
        per_pipe = [options[sig] for sig in signatures]
        shares = allocate_batch(batch, [time for _, time, _ in per_pipe])
        chosen = [found[int(pick[b])] for (found, _, pick), b in zip(per_pipe, shares, strict=True)]
        size_of = [m for _, m in chosen]
        parts = [p for p, _ in chosen]
        # re-cut each pipeline for the number of micro-batches it really got, then re-share
        exact = [
            self.partition_for(
                slots, m, math.ceil(b / m), pipelines=n_pipes, zero=bool(zero), allowed=allowed, signature=sig
            )
            for slots, b, m, sig in zip(structure.pipelines, shares, size_of, signatures, strict=True)
        ]
        if all(p is not None for p in exact):
            parts = exact
            shares = allocate_batch(batch, [_pipeline_time(p, m) for p, m in zip(parts, size_of, strict=True)])
        estimate = max(_pipeline_time(p, m)(b) for p, m, b in zip(parts, size_of, shares, strict=True))
        estimate += self.exposed_sync(structure, parts)
        plan = _to_plan(structure, parts, shares, size_of, self.opts, zero)
        return Candidate(structure.label, plan, estimate, tight=any(p.memory_bound for p in parts))


def simulate_or_none(plan: Plan, profile: ModelProfile, cluster: Cluster) -> SimResult | None:
    """The simulated iteration, or None if a device runs out of memory (checked before simulating:
    the memory walk needs only the compiled action lists, the event run is the expensive part)."""
    check_plan(plan, cluster, profile)
    compiled = compile_plan(plan, len(profile.blocks))
    memory = plan_memory(compiled, profile, cluster, optimizer=plan.optimizer, dtype=plan.dtype, plan=plan)
    if not all(use.fits for use in memory.values()):
        return None
    return simulate(plan, profile, cluster, compiled=compiled)


def evaluate_structure(
    profile: ModelProfile, cluster: Cluster, structure: Structure, opts: PlanOptions
) -> Candidate | None:
    """The best candidate plan for one structure by the closed form (used by tests and baselines)."""
    found = _Search(profile, cluster, opts).evaluate(structure)
    return min(found, key=lambda c: c.estimate) if found else None


def _with_micro(plan: Plan, index: int, micro: tuple[int, ...]) -> Plan:
    pipes = list(plan.pipelines)
    p = pipes[index]
    pipes[index] = Pipeline(p.batch, micro, p.stages)
    return _replace_pipelines(plan, pipes)


def _replace_pipelines(plan: Plan, pipelines: list[Pipeline]) -> Plan:
    return replace(plan, pipelines=pipelines)


def _moves(plan: Plan, m_of: list[int], tables: CostTables) -> list[Plan]:
    """Neighbouring plans: one cut moved by one block (where both stages keep their TP degree and
    every block keeps one degree), or one micro-batch of samples moved."""
    out = []
    for pi, p in enumerate(plan.pipelines):
        for si in range(1, len(p.stages)):
            for delta in (-1, 1):
                cut = p.stages[si].start + delta
                if p.stages[si - 1].start < cut < p.stages[si].end:
                    stages = list(p.stages)
                    a, b = stages[si - 1], stages[si]
                    stages[si - 1] = replace(a, end=cut)
                    stages[si] = replace(b, start=cut)
                    if any(s.tensor_parallel not in tables.tp_options(s.start, s.end) for s in stages[si - 1 : si + 1]):
                        continue
                    pipes = list(plan.pipelines)
                    pipes[pi] = Pipeline(p.batch, p.micro_batches, tuple(stages))
                    moved = _replace_pipelines(plan, pipes)
                    if block_degrees(moved) is not None:
                        out.append(moved)
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
    best: Candidate,
    profile: ModelProfile,
    cluster: Cluster,
    tables: CostTables,
    *,
    local_search: bool,
    budget: list[int] | None = None,
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
            for trial in _moves(plan, m_of, tables):
                result = simulate_or_none(trial, profile, cluster)
                budget[0] -= sim.n_tasks
                if result is not None and result.iteration_s < step_sim.iteration_s * (1 - 1e-9):
                    step_plan, step_sim = trial, result
            if step_plan is plan:
                break
            plan, sim = step_plan, step_sim
    return Candidate(best.label, plan, best.estimate, sim, tight=best.tight)


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
        candidates.extend(search.evaluate(structure))
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
    search = searched.search
    if opts.refine:
        # small clusters: hill-climb from the few best simulated candidates, not only the winner; the
        # closed form that picked each one's cuts and shares can misjudge which structure wins
        small = len(cluster.devices) <= _LOCAL_SEARCH_DEVICES
        ranked = sorted(pool, key=lambda c: c.sim.iteration_s)[: _REFINED_CANDIDATES if small else 1]
        budget = [_REFINE_TASKS]  # simulated tasks, shared: deterministic, unlike a time limit
        refined = [_refine(c, profile, cluster, search.tables, local_search=small, budget=budget) for c in ranked]
        best = min(refined, key=lambda c: c.sim.iteration_s)
    best, zero_alternative = _settle_zero(best, profile, cluster)
    lower = compute_lower_bound(search.tables, cluster, opts.global_batch, list(search.sizes))
    return PlanResult(
        plan=best.plan,
        sim=best.sim,
        lower_bound_s=lower,
        label=best.label,
        candidates=searched.scored,
        baselines=baselines,
        structures=searched.structures,
        explanations=explain_plan(best.plan, search.tables, search.slot_costs, cluster, zero_alternative),
    )


def _zero_alternative(plan: Plan, sim: SimResult, profile: ModelProfile, cluster: Cluster) -> dict[str, Any] | None:
    """The same plan with ZeRO-1 the other way: whether it fits (else the device most over) and its
    iteration; None where every block has one holder (nothing to shard)."""
    if len(plan.pipelines) == 1 and not any(s.replicated for s in plan.pipelines[0].stages):
        return None
    other = replace(plan, zero=1 - plan.zero)
    compiled = compile_plan(other, len(profile.blocks))
    memory = plan_memory(compiled, profile, cluster, optimizer=other.optimizer, dtype=other.dtype, plan=other)
    over = [(use.total - use.capacity, address, use) for address, use in memory.items() if not use.fits]
    if over:
        _, address, use = max(over, key=lambda x: (x[0], x[1]))
        return {"fits": False, "device": address, "needs": use.total, "capacity": use.capacity}
    result = simulate(other, profile, cluster, compiled=compiled)
    return {"fits": True, "iteration_s": result.iteration_s, "this_iteration_s": sim.iteration_s, "sim": result}


def _settle_zero(best: Candidate, profile: ModelProfile, cluster: Cluster) -> tuple[Candidate, dict[str, Any] | None]:
    """Where memory is tight (or ZeRO-1 is on): ZeRO-1 off where it is no slower (it adds collectives
    and a dependency on every holder), on where the simulator finds it strictly faster; returns the
    kept candidate and the other way's figures (``{"tight": False}`` where it was not tried)."""
    single = len(best.plan.pipelines) == 1 and not any(s.replicated for s in best.plan.pipelines[0].stages)
    if not best.tight and not best.plan.zero:
        return best, None if single else {"tight": False}
    alternative = _zero_alternative(best.plan, best.sim, profile, cluster)
    if alternative is not None and alternative["fits"]:
        t_other, t_mine = alternative["iteration_s"], best.sim.iteration_s
        switch = t_other <= t_mine * (1 + 1e-9) if best.plan.zero else t_other < t_mine * (1 - 1e-9)
        if switch:
            flipped = replace(best.plan, zero=1 - best.plan.zero)
            best = Candidate(best.label, flipped, best.estimate, alternative["sim"], tight=best.tight)
            alternative = _zero_alternative(best.plan, best.sim, profile, cluster)
    if alternative is not None:
        alternative.pop("sim", None)
    return best, alternative


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
        **result.explanations,
    }

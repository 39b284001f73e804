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
   Structures are evaluated best bound first (:meth:`_Search.bound`, a lower bound on every
   estimate a structure can give) and only while a bound can still beat the next candidate to
   simulate, so the ranking is exactly that of evaluating them all (docs/planner.md, "Planning
   speed", lists this and every other exact shortcut).
4. **Refinement with the simulator**: startup micro-batch splitting, then moving cuts and samples one
   step at a time while the simulated iteration improves.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hetplan.contracts.cluster import Cluster, Device, Link
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage, check_dtype_supported
from hetplan.errors import HetplanError
from hetplan.schedule.compile import compile_plan
from hetplan.simulate.costs import CostModel
from hetplan.simulate.memory import plan_memory
from hetplan.simulate.simulator import SimResult, simulate, simulate_if_fits
from hetplan.solve.batching import TimeTable, allocate_batch, micro_batch_list, startup_splits, water_fill
from hetplan.solve.bounds import compute_lower_bound
from hetplan.solve.explain import explain_plan
from hetplan.solve.partition import (
    _NO_PRUNE_LIMIT,
    Partition,
    Slot,
    SlotCosts,
    default_tp_link,
    partition,
    pipeline_floor,
)
from hetplan.solve.structures import EXHAUSTIVE_DEVICES, EXHAUSTIVE_STRUCTURES, Structure, candidate_structures
from hetplan.solve.tables import CostTables
from hetplan.solve.ties import ties_agree

__all__ = [
    "Candidate",
    "PlanOptions",
    "PlanResult",
    "Searched",
    "best_plan",
    "evaluate_structure",
    "lower_bound",
    "search_only",
    "search_plans",
    "simulate_or_none",
]

_FEW_PIPELINES = 16  # up to this many pipelines, try every startup-splitting variant
_LOCAL_SEARCH_DEVICES = 8  # up to this many devices, refine with simulator-driven hill-climbing
# from every simulated candidate, best first (the closed form that picked each one's cuts, shares
# and sizes is blind to where a bottleneck stage sits and prices a remainder micro-batch in
# proportion to its size, so a candidate far down the ranking can be one move from the optimum),
_REFINE_TASKS = 120_000  # ... until this many simulated tasks are spent (4 s of a 10 s plan on mixed-small)
_BOUND_SLACK = 1e-9  # relative: a structure's bound is lowered by this before it prunes (float sums)


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
    """The slowest link between two slots' devices (one device per node: a link depends on the
    two nodes only, and links that tie here have the same bandwidth and latency)."""
    first_a = {d.node: d for d in reversed(a.devices)}
    first_b = {d.node: d for d in reversed(b.devices)}
    links = [cluster.link(x, y) for x in first_a.values() for y in first_b.values()]
    return min(links, key=lambda link: (link.bandwidth, -link.latency))


def _signature(cluster: Cluster, slots: tuple[Slot, ...]) -> tuple:
    """Everything a pipeline's partition depends on: each slot's types, shares, whether they form
    one group and the link a TP group of theirs all-reduces over, and the links between slots."""

    def tp_link(s: Slot) -> tuple[float, float] | None:
        if len(s.devices) < 2:
            return None
        link = cluster.link(s.devices[0], s.devices[-1])
        return link.bandwidth, link.latency

    kinds = tuple((tuple(d.type.name for d in s.devices), s.shares, s.one_group, tp_link(s)) for s in slots)
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


def _pipeline_table(part: Partition, m: int, batch: int) -> TimeTable:
    """:func:`_pipeline_time` for every ``b`` up to ``batch + 1`` at once, the same arithmetic
    elementwise (so :func:`allocate_batch` may water-fill it with numpy)."""
    b = np.arange(batch + 2, dtype=float)
    full, rest = np.floor(b / m), np.mod(b, m)
    share = (rest > 0).astype(float) if part.replicated else rest / m
    small = part.total * (np.ones_like(b) if part.replicated else b / m)
    return TimeTable(np.where(b <= m, small, (full - 1) * part.bottleneck + part.total + share * part.bottleneck))


def _size_row(part: Partition, m: int, smallest: int, b: np.ndarray) -> np.ndarray:
    """A pipeline's closed-form time for each ``b`` at micro-batch ``m`` (:func:`_pipeline_time`),
    inf below ``m`` where a smaller size exists (fewer samples run as one smaller micro-batch,
    which that size prices)."""
    full, rest = np.floor(b / m), np.mod(b, m)
    share = (rest > 0).astype(float) if part.replicated else rest / m  # as _pipeline_time
    small = part.total * (np.ones_like(b) if part.replicated else b / m)
    row = np.where(b <= m, small, (full - 1) * part.bottleneck + part.total + share * part.bottleneck)
    if m > smallest:
        row[b < m] = np.inf
    return row


def _floor_row(floor: tuple[float, float], m: int, b: np.ndarray) -> np.ndarray:
    """Below :func:`_size_row` for every partition at ``m`` whose bottleneck and total are at
    least ``floor``'s, where a smaller size exists (``(b/m - 1) bottleneck + total`` from ``m``
    samples on, inf below), lowered by ``_BOUND_SLACK``."""
    bottleneck, total = floor
    row = np.where(b < m, np.inf, (b / m - 1) * bottleneck + total)
    return row * (1 - _BOUND_SLACK)


def _share_caps(upper: list[np.ndarray], lower: list[np.ndarray], copies: list[int], extra: int) -> list[int]:
    """Per distinct pipeline, a share water-filling cannot exceed, from tables above and below its
    own (:func:`hetplan.solve.batching.allocate_batch` pops steps in the order of their
    pipeline's running maximum and takes every step up to the ``extra``-th smallest of those
    maxima: that value is at most the one the upper tables give, and a pipeline's steps up to it
    are at most those of its lower table that are)."""
    if extra == 0:
        return [1] * len(upper)
    up = [np.maximum.accumulate(u[2 : extra + 2]) for u in upper]
    values = np.unique(np.concatenate(up))
    taken = np.zeros(len(values), dtype=np.int64)
    for level, count in zip(up, copies, strict=True):
        taken += count * np.searchsorted(level, values, side="right")
    limit = values[int(np.searchsorted(taken, extra, side="left"))]
    return [1 + int(np.searchsorted(np.maximum.accumulate(lo[2 : extra + 2]), limit, side="right")) for lo in lower]


def _fastest(options: list[tuple[Partition, int]], batch: int) -> tuple[TimeTable, np.ndarray]:
    """A pipeline's time for ``b`` samples (up to ``batch``) at whichever micro-batch size is
    fastest for ``b`` (the first of equals), and that choice's index, per ``b``: one table."""
    b = np.arange(batch + 2, dtype=float)
    smallest = min(m for _, m in options)
    table = np.array([_size_row(p, m, smallest, b) for p, m in options])
    pick = np.argmin(table, axis=0)
    best = table[pick, np.arange(batch + 2)]
    return TimeTable(best), pick


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


@dataclass
class _Groups:
    """A structure's pipelines by signature (cached per structure: every evaluation, bound and
    degree map of it starts here): the distinct signatures in order of first appearance, a
    representative's slots of each, each pipeline's group, and the first stages' devices (listed,
    and counted per node in ring order) that the exposed all-reduce spans."""

    signatures: list[int]
    slots: list[tuple[Slot, ...]]
    which: np.ndarray
    copies: list[int]
    first_devices: list[Device]
    first_counts: dict[str, int]


def _fill(batch: int, tables: list[TimeTable], which: np.ndarray) -> np.ndarray:
    """:func:`allocate_batch` of the pipelines whose time is ``tables[which[p]]``."""
    shares = water_fill(batch, [t.values for t in tables], which)
    if shares is None:  # NaN in a table: the heap decides, as allocate_batch would
        shares = np.asarray(allocate_batch(batch, [tables[w] for w in which.tolist()]))
    return shares


@dataclass
class _Found:
    """A structure's candidate before its plan is built: most are never simulated, and the plan of
    a 512-device structure is thousands of objects (:meth:`candidate` builds it)."""

    structure: Structure
    parts: list[Partition]
    shares: list[int]
    sizes: list[int]
    zero: int
    estimate: float
    tight: bool
    distinct: list[Partition] = field(default_factory=list)  # the partitions of ``parts``, each once

    def plan(self, opts: PlanOptions) -> Plan:
        """The plan (built anew on each call)."""
        return _to_plan(self.structure, self.parts, self.shares, self.sizes, opts, self.zero)

    def candidate(self, opts: PlanOptions) -> Candidate:
        """The search's :class:`Candidate` of it, plan built."""
        return Candidate(self.structure.label, self.plan(opts), self.estimate, tight=self.tight)

    def degrees(self) -> dict[int, int] | None:
        """:func:`block_degrees` of the plan, from the partitions (each distinct one once)."""
        degree: dict[int, int] = {}
        seen: set[int] = set()
        for part in self.distinct or self.parts:
            if id(part) in seen:
                continue
            seen.add(id(part))
            for s in range(len(part.cuts) - 1):
                t = part.option(s)[0]
                for b in range(part.cuts[s], part.cuts[s + 1]):
                    if degree.setdefault(b, t) != t:
                        return None
        return degree


def _sizes(opts: PlanOptions) -> tuple[int, ...]:
    """The micro-batch sizes the search tries, ascending (default: powers of two up to 64)."""
    return tuple(sorted(set(opts.micro_batch_sizes or tuple(2**k for k in range(7)))))


def lower_bound(profile: ModelProfile, cluster: Cluster, opts: PlanOptions) -> float:
    """The plan's lower bound as :func:`best_plan` computes it, from inputs alone: a caller may
    compute it elsewhere (:func:`hetplan.solve.training.plan_training`, in its second process,
    which keeps scipy's import out of the planning process) and hand it to :func:`best_plan`."""
    tables = CostTables(profile, cluster, optimizer=opts.optimizer)
    return compute_lower_bound(tables, cluster, opts.global_batch, list(_sizes(opts)))


class _Search:
    """State shared by one planning run: tables, caches, options."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, opts: PlanOptions) -> None:
        self.profile, self.cluster, self.opts = profile, cluster, opts
        self.tables = CostTables(profile, cluster, optimizer=opts.optimizer)
        self.costs = CostModel(profile, cluster, optimizer=opts.optimizer)
        self.slot_costs = SlotCosts(self.tables, default_tp_link(self.tables))
        self.cache: dict[tuple, Partition | None] = {}
        self.signatures: dict[tuple, int] = {}
        self._interned: dict[tuple, int] = {}
        self._pipeline_signatures: dict[int, tuple[tuple[Slot, ...], int]] = {}
        self._slot_counts: dict[int, tuple[Slot, list[tuple[str, int]]]] = {}
        self._links: dict[int, list[Link]] = {}
        self._sync_floors: dict[int, tuple[Structure, float]] = {}
        self._groups: dict[int, tuple[Structure, _Groups]] = {}
        self._parts: dict[int, tuple[tuple, tuple[np.ndarray, list[Device], dict[str, int]]]] = {}
        self._size_rows: dict[tuple[int, int, int], np.ndarray] = {}
        self._floor_rows: dict[tuple, np.ndarray | None] = {}
        self._lower_rows: dict[tuple, np.ndarray] = {}
        self._shares_axis = np.arange(opts.global_batch + 2, dtype=float)  # b = 0 .. batch + 1
        self.floors: dict[tuple, tuple[float, float] | None] = {}
        self.bound_tables: dict[tuple, TimeTable | None] = {}
        self._fastest: dict[tuple, tuple[list[tuple[Partition, int]], TimeTable, np.ndarray]] = {}
        self.sizes = _sizes(opts)
        n = self.tables.n
        self.degrees = tuple(sorted({t for b in range(n) for t in self.tables.tp_options(b, b + 1)}))

    def signature(self, slots: tuple[Slot, ...]) -> int:
        """What a pipeline's partition depends on (types, shares, links), cached by its devices
        (and, first, by the slots object itself: the structured families share one pipeline
        object among every structure that holds it, and building the key costs more than that)."""
        same = self._pipeline_signatures.get(id(slots))
        if same is not None and same[0] is slots:
            return same[1]
        key = tuple(tuple(d.address for d in s.devices) for s in slots)
        if key not in self.signatures:
            # interned: a small int stands for the signature in every cache key (cheap to hash)
            self.signatures[key] = self._interned.setdefault(_signature(self.cluster, slots), len(self._interned))
        self._pipeline_signatures[id(slots)] = (slots, self.signatures[key])
        return self.signatures[key]

    def links_of(self, slots: tuple[Slot, ...], signature: int) -> list[Link]:
        """The slowest link between each two consecutive slots (part of the signature: cached by it)."""
        found = self._links.get(signature)
        if found is None:
            found = self._links[signature] = [_slowest_link(self.cluster, a, b) for a, b in itertools.pairwise(slots)]
        return found

    def size_row(self, part: Partition, m: int, smallest: int) -> np.ndarray:
        """:func:`_size_row` over every share up to the batch (cached: partitions are kept alive)."""
        key = (id(part), m, smallest)
        found = self._size_rows.get(key)
        if found is None:
            found = self._size_rows[key] = _size_row(part, m, smallest, self._shares_axis)
        return found

    def floor_row(
        self, slots: tuple[Slot, ...], m: int, signature: int, allowed: tuple[frozenset[int], ...] | None
    ) -> np.ndarray | None:
        """:func:`_floor_row` of :meth:`floor_for` over every share (None: no split; cached)."""
        key = (signature, m, allowed)
        if key not in self._floor_rows:
            floor = self.floor_for(slots, m, signature, allowed)
            self._floor_rows[key] = None if floor is None else _floor_row(floor, m, self._shares_axis)
        return self._floor_rows[key]

    def groups_of(self, structure: Structure) -> _Groups:
        """:class:`_Groups` of a structure (cached per structure object; built from its shared
        ``parts`` where it has them, each part's pipelines looked at once per search)."""
        same = self._groups.get(id(structure))
        if same is None or same[0] is not structure:
            parts = structure.parts or (structure.pipelines,)
            sigs: list[np.ndarray] = []
            devices: list[Device] = []
            counts: dict[str, int] = {}
            for part in parts:
                part_sigs, part_devices, part_counts = self._part(part)
                sigs.append(part_sigs)
                devices.extend(part_devices)
                for node, count in part_counts.items():
                    counts[node] = counts.get(node, 0) + count
            every = np.concatenate(sigs) if len(sigs) > 1 else sigs[0]
            # groups in order of first appearance, as a dict over the pipelines would number them
            distinct, first_at, inverse = np.unique(every, return_index=True, return_inverse=True)
            order = np.argsort(first_at, kind="stable")
            rank = np.empty(len(order), dtype=np.int64)
            rank[order] = np.arange(len(order))
            which = rank[inverse.ravel()]
            groups = _Groups(
                signatures=[int(distinct[g]) for g in order],
                slots=[structure.pipelines[int(first_at[g])] for g in order],
                which=which,
                copies=np.bincount(which, minlength=len(order)).tolist(),
                first_devices=devices,
                first_counts=counts,
            )
            same = self._groups[id(structure)] = (structure, groups)
        return same[1]

    def _part(self, part: tuple[tuple[Slot, ...], ...]) -> tuple[np.ndarray, list[Device], dict[str, int]]:
        """A list of pipelines' signatures, first stages' devices and those per node (cached per
        list object: the structured families share one among many structures)."""
        same = self._parts.get(id(part))
        if same is None or same[0] is not part:
            counts: dict[str, int] = {}
            for slots in part:
                for node, count in self._node_counts(slots[0]):
                    counts[node] = counts.get(node, 0) + count
            found = (
                np.asarray([self.signature(slots) for slots in part], dtype=np.int64),
                [d for slots in part for d in slots[0].devices],
                counts,
            )
            same = self._parts[id(part)] = (part, found)
        return same[1]

    def sizes_for(self, n_pipes: int) -> list[int]:
        """Micro-batch sizes a pipeline of a structure with ``n_pipes`` pipelines may run: up to
        twice the even share (and what fits a share), and always the smallest."""
        batch = self.opts.global_batch
        even = math.ceil(batch / n_pipes)
        return [m for i, m in enumerate(self.sizes) if i == 0 or m <= min(2 * even, batch - n_pipes + 1)]

    def floor_for(
        self, slots: tuple[Slot, ...], m: int, signature: int, allowed: tuple[frozenset[int], ...] | None = None
    ) -> tuple[float, float] | None:
        """:func:`pipeline_floor` of a pipeline at micro-batch ``m``, each block at a degree
        ``allowed`` gives it (cached by its signature)."""
        key = (signature, m, allowed)
        if key not in self.floors:
            links = self.links_of(slots, signature)
            self.floors[key] = pipeline_floor(
                self.tables,
                list(slots),
                m=m,
                links=links,
                costs=self.slot_costs,
                holders=len(self.cluster.devices),
                allowed=allowed,
            )
        return self.floors[key]

    def bound(
        self,
        structure: Structure,
        allowed: tuple[frozenset[int], ...] | None = None,
        only_size: int | None = None,
    ) -> float:
        """No candidate :meth:`evaluate` returns for ``structure`` has a smaller estimate (inf: it
        returns none).

        A pipeline's closed form for ``b`` samples at micro-batch ``m``, ``(b/m - 1) bottleneck +
        total`` from ``m`` samples on (``total b/m`` below: at least that, replicated or not), is at
        least the same with the smallest bottleneck and the smallest total any split at ``m`` can
        have (:meth:`floor_for`: fastest options, memory and allowed degrees ignored, so it holds for
        every micro-batch count, ZeRO setting and degree map the evaluation tries); the smallest of
        these over the sizes never falls as ``b`` grows, so water-filling it gives the smallest
        slowest pipeline any batch split can have; the estimate adds the exposed all-reduce to
        that, at least :meth:`sync_floor`. Scaled by ``1 - _BOUND_SLACK``: the DP adds stage
        times in another order than the partition does (a few ulps). With ``allowed`` (and
        ``only_size``), the bound of :meth:`_evaluate` with that degree map (and size)."""
        n_pipes = len(structure.pipelines)
        batch = self.opts.global_batch
        if n_pipes > batch:
            return math.inf
        sizes = self.sizes_for(n_pipes)
        if only_size is not None:
            if only_size not in sizes:
                return math.inf
            sizes = [only_size]
        groups = self.groups_of(structure)
        b = np.arange(batch + 2, dtype=float)
        tables: list[TimeTable] = []
        for slots, sig in zip(groups.slots, groups.signatures, strict=True):
            key = (sig, tuple(sizes), allowed)
            table = self.bound_tables.get(key)
            if table is None:
                rows = []
                for m in sizes:
                    floor = self.floor_for(slots, m, sig, allowed)
                    if floor is not None:
                        bottleneck, total = floor
                        rows.append(np.where(b < m, total * b / m, (b / m - 1) * bottleneck + total))
                table = TimeTable(np.min(rows, axis=0) * (1 - _BOUND_SLACK)) if rows else None
                self.bound_tables[key] = table
            if table is None:
                return math.inf  # no split at any size: every partition is None
            tables.append(table)
        shares = _fill(batch, tables, groups.which)
        slowest = float(np.stack([t.values for t in tables])[groups.which, shares].max())
        return slowest + self.sync_floor(structure) * (1 - _BOUND_SLACK)

    def sync_floor(self, structure: Structure) -> float:
        """No :meth:`exposed_sync` of the structure is smaller: the first stages hold at least
        block 0 (all blocks where every pipeline has one stage), and the degree is one their slots
        can form and block 0 has (an all-reduce never gets faster with more bytes over the same
        devices, so the smallest over those degrees bounds it)."""
        same = self._sync_floors.get(id(structure))
        if same is None or same[0] is not structure:
            same = self._sync_floors[id(structure)] = (structure, self._sync_floor(structure))
        return same[1]

    def _sync_floor(self, structure: Structure) -> float:
        if len(structure.pipelines) == 1 and len(structure.pipelines[0][0].devices) == 1:
            return 0.0
        first = self.tables.tp_options(0, 1)  # every first stage holds block 0
        degrees = sorted({t for slots in structure.pipelines for t in slots[0].degrees() if t in first})
        # a pipeline of one stage holds every block; the first stage of a longer one, block 0 at least
        end = self.tables.n if all(len(slots) == 1 for slots in structure.pipelines) else 1
        nbytes = self.costs.gradient_bytes(tuple(range(end)))
        groups = self.groups_of(structure)
        times = []
        for t in degrees:
            if t == 1:  # every first-stage device: counted per node
                times.append(self.costs.allreduce_over_nodes(nbytes, groups.first_counts))
            else:
                times.append(self.costs.allreduce(nbytes / t, groups.first_devices[::t]))
        return min(times)

    def _node_counts(self, slot: Slot) -> list[tuple[str, int]]:
        """A slot's devices per node, nodes in the order they appear (cached per slot object)."""
        same = self._slot_counts.get(id(slot))
        if same is None or same[0] is not slot:
            counts: dict[str, int] = {}
            for d in slot.devices:
                counts[d.node] = counts.get(d.node, 0) + 1
            same = self._slot_counts[id(slot)] = (slot, list(counts.items()))
        return same[1]

    def partition_for(
        self,
        slots: tuple[Slot, ...],
        m: int,
        n_micro: int,
        *,
        pipelines: int = 1,
        zero: bool = False,
        allowed: tuple[frozenset[int], ...] | None = None,
        signature: int | None = None,
    ) -> Partition | None:
        """The best cuts and stage options for one pipeline running ``n_micro`` micro-batches of ``m`` (cached)."""
        if signature is None:
            signature = self.signature(slots)
        if self.opts.schedule != "gpipe":
            # 1F1B: past max(stages, _NO_PRUNE_LIMIT + 1) micro-batches neither the memory a stage
            # holds nor the DP's (lexicographic) objective changes: one answer for all those counts
            n_micro = min(n_micro, max(len(slots), _NO_PRUNE_LIMIT + 1))
        # without ZeRO-1 the pipeline count matters only as "one, or more" (are the gradients
        # all-reduced): any two or more give the same partition
        key = (signature, m, n_micro, pipelines if zero else min(pipelines, 2), zero, allowed)
        if key not in self.cache:
            links = self.links_of(slots, signature)
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
        return self._exposed_sync(self.groups_of(structure), parts)

    def _exposed_sync(self, groups: _Groups, parts: list[Partition]) -> float:
        """:meth:`exposed_sync` from the structure's groups (``parts``: each partition at least once)."""
        if len(groups.which) == 1 and len(groups.slots[0][0].devices) == 1:
            return 0.0
        end = min(p.cuts[1] for p in parts)
        tp = max(p.option(0)[0] for p in parts)
        nbytes = self.costs.gradient_bytes(tuple(range(end))) / tp
        if tp == 1:  # every first-stage device: the same ring, counted per node
            return self.costs.allreduce_over_nodes(nbytes, groups.first_counts)
        return self.costs.allreduce(nbytes, groups.first_devices[::tp])

    def _tied_sync(self, structure: Structure, parts: list[Partition]) -> float:
        """The all-reduces of the shared (tied) parameters' gradients over their holders: after the
        backward, before the step, overlapping nothing (the simulator's order); 0 without any."""
        total = 0.0
        for index, entry in enumerate(self.profile.shared):
            devices: list[Device] = []
            degree = 1
            for slots, part in zip(structure.pipelines, parts, strict=True):
                for s in range(len(part.cuts) - 1):
                    if entry.held_by(part.cuts[s], part.cuts[s + 1]):
                        degree = part.option(s)[0]
                        devices.extend(slots[s].devices[::degree])  # shard 0's holders: one per replica
            if len(devices) > 1:
                total += self.costs.allreduce(self.costs.shared_gradient_bytes(index, degree), devices)
        return total

    def evaluate(self, structure: Structure) -> list[Candidate]:
        """The structure's best candidate without ZeRO, and with it where memory is tight."""
        return [found.candidate(self.opts) for found in self.found(structure)]

    def found(self, structure: Structure) -> list[_Found]:
        """:meth:`evaluate`'s candidates before their plans are built."""
        out: list[_Found] = []
        plain = self._agreeing(structure, zero=0)
        if plain is not None:
            out.append(plain)
            if len(self.cluster.devices) <= _LOCAL_SEARCH_DEVICES:
                # small clusters: every pipeline at each one micro-batch size too, cut for it; the
                # closed form that picks the size ignores the overlap the simulator sees (a size with
                # more, smaller micro-batches can win by its pipelining)
                plain_pipelines = plain.plan(self.opts).pipelines
                for m in self.sizes:
                    alt = self._evaluate(structure, zero=0, allowed=None, only_size=m)
                    if alt is None or alt.plan(self.opts).pipelines == plain_pipelines:
                        continue
                    if not ties_agree(alt.degrees(), self.profile):  # holders disagree: as _agreeing does
                        alt = self._agreeing(structure, zero=0, only_size=m)
                    if alt is not None:
                        out.append(alt)
        holders = len(structure.pipelines) > 1 or any(len(s.devices) > 1 for p in structure.pipelines for s in p)
        if holders and not self.profile.shared and (plain is None or plain.tight):  # ZeRO-1 refuses ties
            zero = self._agreeing(structure, zero=1)
            if zero is not None:
                out.append(zero)
        return out

    def _agreeing(self, structure: Structure, *, zero: int, only_size: int | None = None) -> _Found | None:
        """The best candidate in which every holder of a block uses one TP degree."""
        free = self._evaluate(structure, zero=zero, allowed=None, only_size=only_size)
        if free is None or len(self.degrees) == 1 or ties_agree(free.degrees(), self.profile):
            return free
        n = self.tables.n
        largest = int(np.argmax(free.shares))  # the first of the largest
        of_largest = free.parts[largest]
        per_block = {
            b: of_largest.option(s)[0]
            for s in range(len(of_largest.cuts) - 1)
            for b in range(of_largest.cuts[s], of_largest.cuts[s + 1])
        }
        for entry in self.profile.shared:  # a tied entry's holders: the smallest degree they all have
            chosen = sorted({per_block[b] for b in entry.blocks})
            common = [t for t in chosen if all(t in self.tables.tp_options(b, b + 1) for b in entry.blocks)]
            for b in entry.blocks:
                per_block[b] = common[0] if common else 1
        maps = [tuple(frozenset({per_block[b]}) for b in range(n))]
        for t in self.degrees:
            maps.append(tuple(frozenset({t if t in self.tables.tp_options(b, b + 1) else 1}) for b in range(n)))
        best: _Found | None = None
        for allowed in maps:
            # a map whose bound is no better than the best so far cannot replace it (strictly less),
            # and one with no bound at all has no split that fits (its evaluation returns None)
            bound = self.bound(structure, allowed, only_size)
            if bound == math.inf or (best is not None and bound >= best.estimate):
                continue
            c = self._evaluate(structure, zero=zero, allowed=allowed, only_size=only_size)
            if c is not None and ties_agree(c.degrees(), self.profile) and (best is None or c.estimate < best.estimate):
                best = c
        return best

    def _evaluate(
        self,
        structure: Structure,
        *,
        zero: int,
        allowed: tuple[frozenset[int], ...] | None,
        only_size: int | None = None,
    ) -> _Found | None:
        n_pipes = len(structure.pipelines)
        batch = self.opts.global_batch
        if n_pipes > batch:
            return None
        # a pipeline may take more than its even share: sizes up to twice that (and what fits a share)
        sizes = self.sizes_for(n_pipes)
        if only_size is not None:
            if only_size not in sizes:
                return None
            sizes = [only_size]
        n_micro = {m: math.ceil(batch / n_pipes / m) for m in sizes}
        groups = self.groups_of(structure)
        # identical pipelines are solved and tabulated once: first each one's smallest size that fits
        first: list[tuple[list[tuple[Partition, int]], int]] = []
        for sig, slots in zip(groups.signatures, groups.slots, strict=True):
            found = []
            for m in sizes:
                part = self.partition_for(
                    slots, m, n_micro[m], pipelines=n_pipes, zero=bool(zero), allowed=allowed, signature=sig
                )
                if part is not None:
                    found.append((part, m))
                    break
            if not found:
                return None
            first.append((found, sizes.index(found[0][1]) + 1))
        caps = self._share_caps(groups, first, sizes, allowed)
        options: list[tuple] = []
        for sig, slots, (found, rest), cap in zip(groups.signatures, groups.slots, first, caps, strict=True):
            smallest = found[0][1]
            seen = self.size_row(found[0][0], smallest, smallest)[: cap + 2]
            for m in sizes[rest:]:
                floor = self.floor_row(slots, m, sig, allowed)
                # a size no faster than those before it at any share the allocation can look at
                # never wins there (ties go to the earlier size): its partition is not needed
                if floor is None or bool(np.all(floor[: cap + 2] >= seen)):
                    continue
                part = self.partition_for(
                    slots, m, n_micro[m], pipelines=n_pipes, zero=bool(zero), allowed=allowed, signature=sig
                )
                if part is not None:
                    found.append((part, m))
                    seen = np.minimum(seen, self.size_row(part, m, smallest)[: cap + 2])
            options.append(self.fastest(found))  # (only_size: the one size)
        shares = _fill(batch, [table for _, table, _ in options], groups.which)
        # each pipeline at the size fastest for its share, re-cut for the micro-batches it really got
        # (then re-shared); pipelines alike in signature and share are one computation
        keys, inverse = np.unique(groups.which * (batch + 2) + shares, return_inverse=True)
        picked: list[tuple[Partition, int, Partition | None]] = []
        for key in keys.tolist():
            group, share = divmod(key, batch + 2)
            found, _, pick = options[group]
            part, m = found[int(pick[share])]
            exact = self.partition_for(
                groups.slots[group],
                m,
                math.ceil(share / m),
                pipelines=n_pipes,
                zero=bool(zero),
                allowed=allowed,
                signature=groups.signatures[group],
            )
            picked.append((part, m, exact))
        inverse_list = inverse.ravel().tolist()
        size_of = [picked[u][1] for u in inverse_list]
        if all(exact is not None for _, _, exact in picked):
            # identical pipelines (one partition, one size) share one table
            tables: dict[tuple[int, int], int] = {}
            rows: list[TimeTable] = []
            row_of = []
            for _, m, exact in picked:
                table_key = (id(exact), m)
                if table_key not in tables:
                    tables[table_key] = len(rows)
                    rows.append(_pipeline_table(exact, m, batch))
                row_of.append(tables[table_key])
            which = np.asarray(row_of, dtype=np.int64)[inverse.ravel()]
            shares = _fill(batch, rows, which)
            distinct = [exact for _, _, exact in picked]
            parts = [distinct[u] for u in inverse_list]
            members = np.unique(which * (batch + 2) + shares, return_index=True)[1]  # one of each table and share
        else:
            distinct = [part for part, _, _ in picked]
            parts = [distinct[u] for u in inverse_list]
            members = np.unique(inverse.ravel(), return_index=True)[1]  # shares as first allocated
        estimate = max(_pipeline_time(parts[i], size_of[i])(int(shares[i])) for i in members.tolist())
        estimate += self._exposed_sync(groups, distinct) + self._tied_sync(structure, parts)
        return _Found(
            structure,
            parts,
            shares.tolist(),
            size_of,
            zero,
            estimate,
            tight=any(p.memory_bound for p in distinct),
            distinct=distinct,
        )

    def _share_caps(
        self,
        groups: _Groups,
        first: list[tuple[list[tuple[Partition, int]], int]],
        sizes: list[int],
        allowed: tuple[frozenset[int], ...] | None,
    ) -> list[int]:
        """Per group, a share the first water-filling cannot exceed (:func:`_share_caps`): above
        each pipeline's table, its smallest fitting size's own; below it, the smaller of that and
        every larger size's :func:`_floor_row`. The allocation reads a pipeline's table only up to
        one past its share, so sizes are compared only there."""
        batch = self.opts.global_batch
        extra = batch - len(groups.which)
        if all(rest == len(sizes) for _, rest in first):
            return [batch] * len(first)  # nothing left to prune
        upper, lower = [], []
        for sig, slots, (found, rest) in zip(groups.signatures, groups.slots, first, strict=True):
            part, smallest = found[0]
            row = self.size_row(part, smallest, smallest)
            upper.append(row)
            key = (id(part), smallest, sig, tuple(sizes[rest:]), allowed)
            low = self._lower_rows.get(key)
            if low is None:
                low = row
                for m in sizes[rest:]:
                    floor = self.floor_row(slots, m, sig, allowed)
                    if floor is not None:
                        low = np.minimum(low, floor)
                self._lower_rows[key] = low
            lower.append(low)
        return [min(cap, batch) for cap in _share_caps(upper, lower, groups.copies, extra)]

    def fastest(self, found: list[tuple[Partition, int]]) -> tuple[list[tuple[Partition, int]], TimeTable, np.ndarray]:
        """``(found, *_fastest(found, batch))``, cached by the partitions (which the partition
        cache keeps alive, so their ids stay theirs)."""
        key = tuple((id(p), m) for p, m in found)
        got = self._fastest.get(key)
        if got is None:
            got = self._fastest[key] = (found, *_fastest(found, self.opts.global_batch))
        return got


def simulate_or_none(plan: Plan, profile: ModelProfile, cluster: Cluster) -> SimResult | None:
    """The simulated iteration, or None if a device runs out of memory (checked before simulating:
    the memory walk needs only the compiled action lists, the event run is the expensive part)."""
    return simulate_if_fits(plan, profile, cluster)


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


#: Recomputation from the least added time to the least memory (as the search and the brute force order it).
_RECOMPUTE_ORDER = ("none", "selective", "full")


def _recompute_steps(before: Stage, after: Stage) -> list[str]:
    """The recomputation a stage keeps after a cut moved, and the next one towards less memory
    where it grew (it may no longer fit) or towards less time where it shrank (it may not need it)."""
    i = _RECOMPUTE_ORDER.index(before.recompute)
    grew = after.end - after.start > before.end - before.start
    shrank = after.end - after.start < before.end - before.start
    other = i + 1 if grew else i - 1 if shrank else -1
    return [before.recompute] + ([_RECOMPUTE_ORDER[other]] if 0 <= other < len(_RECOMPUTE_ORDER) else [])


def _fitted(plan: Plan, profile: ModelProfile, cluster: Cluster) -> Plan | None:
    """``plan`` with every stage whose devices run out of memory moved along none, selective, full
    until all fit, one step a round (a stage's recomputation changes its own memory only); None
    where a stage at full recomputation still does not fit. What the brute force does per stage,
    for a move of the refinement that changed a stage's memory (a sample, a micro-batch size)."""
    for _ in range(len(_RECOMPUTE_ORDER)):
        compiled = compile_plan(plan, len(profile.blocks))
        memory = plan_memory(compiled, profile, cluster, optimizer=plan.optimizer, dtype=plan.dtype, plan=plan)
        over = sorted(
            {(compiled.programs[a].pipeline, compiled.programs[a].stage) for a, u in memory.items() if not u.fits}
        )
        if not over:
            return plan
        pipes = list(plan.pipelines)
        for pi, si in over:
            stages = list(pipes[pi].stages)
            step = _RECOMPUTE_ORDER.index(stages[si].recompute) + 1
            if step == len(_RECOMPUTE_ORDER):
                return None
            stages[si] = replace(stages[si], recompute=_RECOMPUTE_ORDER[step])
            pipes[pi] = Pipeline(pipes[pi].batch, pipes[pi].micro_batches, tuple(stages))
        plan = _replace_pipelines(plan, pipes)
    return None


def _moves(plan: Plan, tables: CostTables, sizes: tuple[int, ...]) -> list[Plan]:
    """Neighbouring plans: one cut moved by one block, or a middle stage's range slid by one block
    (both its cuts at once: which stage holds the bottleneck matters to the fill and drain, and
    one cut at a time passes through a worse plan), each stage it touches at its recomputation or
    the next step (:func:`_recompute_steps`), where every stage keeps its TP degree and every
    block keeps one degree; or one sample moved between two pipelines, each of them at its own
    micro-batch size or the next smaller or larger of ``sizes``, or one pipeline's micro-batch size
    changed to the next smaller or larger (the closed form prices a remainder micro-batch in
    proportion to its size, optimistic where two samples run more efficiently together than one,
    so a share and a size the search chose can both be off by one step)."""
    out = []
    m_of = [max(p.micro_batches) for p in plan.pipelines]
    for pi, p in enumerate(plan.pipelines):
        moves = [((si,), delta) for si in range(1, len(p.stages)) for delta in (-1, 1)]
        moves += [((si, si + 1), delta) for si in range(1, len(p.stages) - 1) for delta in (-1, 1)]
        for cut_at, delta in moves:
            bounds = [s.start for s in p.stages] + [p.stages[-1].end]
            for si in cut_at:
                bounds[si] += delta
            if any(lo >= hi for lo, hi in itertools.pairwise(bounds)):
                continue
            stages = [replace(s, start=bounds[i], end=bounds[i + 1]) for i, s in enumerate(p.stages)]
            touched = range(cut_at[0] - 1, cut_at[-1] + 1)
            if any(stages[i].tensor_parallel not in tables.tp_options(stages[i].start, stages[i].end) for i in touched):
                continue
            # a stage that grew may need one step more recomputation to fit, one that shrank one step less
            choices = [_recompute_steps(p.stages[i], stages[i]) for i in touched]
            for settings in itertools.product(*choices):
                tried = list(stages)
                for i, recompute in zip(touched, settings, strict=True):
                    tried[i] = replace(tried[i], recompute=recompute)
                pipes = list(plan.pipelines)
                pipes[pi] = Pipeline(p.batch, p.micro_batches, tuple(tried))
                moved = _replace_pipelines(plan, pipes)
                if ties_agree(block_degrees(moved), tables.profile):
                    out.append(moved)

    def near(m: int) -> list[int]:  # m, then its neighbours among the sizes
        below = [x for x in sizes if x < m]
        above = [x for x in sizes if x > m]
        return [m, *below[-1:], *above[:1]]

    def resized(p: Pipeline, batch: int, m: int) -> Pipeline:
        return Pipeline(batch, micro_batch_list(batch, min(m, batch)), p.stages)

    for src in range(len(plan.pipelines)):
        for dst in range(len(plan.pipelines)):
            if src == dst or plan.pipelines[src].batch <= 1:
                continue
            s, d = plan.pipelines[src], plan.pipelines[dst]
            seen = set()
            for m_src, m_dst in itertools.product(near(m_of[src]), near(m_of[dst])):
                pipes = list(plan.pipelines)
                pipes[src] = resized(s, s.batch - 1, m_src)
                pipes[dst] = resized(d, d.batch + 1, m_dst)
                key = (pipes[src].micro_batches, pipes[dst].micro_batches)
                if key not in seen:
                    seen.add(key)
                    out.append(_replace_pipelines(plan, pipes))
    for pi, p in enumerate(plan.pipelines):
        for m in near(m_of[pi])[1:]:
            changed = resized(p, p.batch, m)
            if changed.micro_batches != p.micro_batches:
                pipes = list(plan.pipelines)
                pipes[pi] = changed
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
    sizes: tuple[int, ...] = (),
) -> Candidate:
    """Startup splitting, then (small plans) hill-climbing on cuts, batch shares and micro-batch
    sizes (``sizes``: those the search may use).

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
        sizes = sizes or tuple(sorted({max(p.micro_batches) for p in plan.pipelines}))
        budget = budget if budget is not None else [_REFINE_TASKS]
        for _ in range(50):  # steepest descent: the best neighbour each round (first-improvement stalls early)
            step_plan, step_sim = plan, sim
            if budget[0] <= 0:
                break
            for trial in _moves(plan, tables, sizes):
                result = simulate_or_none(trial, profile, cluster)
                budget[0] -= sim.n_tasks
                if result is None:  # out of memory: the same move with the recomputation it needs
                    fitted = _fitted(trial, profile, cluster)
                    if fitted is not None and fitted != trial:
                        trial, result = fitted, simulate_or_none(fitted, profile, cluster)
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


def _ranked(
    search: _Search,
    structures: list[Structure],
    top_k: int,
    progress: Callable[[int, int], None] | None,
) -> Iterator[Candidate]:
    """Every structure's candidates in the order of a stable sort by estimate (ties: enumeration
    order, then the order :meth:`_Search.evaluate` returns them), each yielded only once it is
    known to come next; the caller stops after ``top_k`` fit (0: it takes all).

    With ``top_k`` the structures are evaluated best bound first (:meth:`_Search.bound`), and only
    while the best pending candidate's estimate is at least the next structure's bound: a
    structure with a larger bound has only candidates that sort after it, so the order yielded is
    the full sort's, and the structures never reached need not be evaluated at all.
    """
    total = len(structures)
    if not top_k:
        candidates: list[tuple[float, int, int, _Found]] = []
        for i, structure in enumerate(structures):
            candidates.extend((c.estimate, i, k, c) for k, c in enumerate(search.found(structure)))
            if progress:
                progress(i + 1, total)
        candidates.sort(key=lambda x: x[:3])
        yield from (c.candidate(search.opts) for *_, c in candidates)
        return
    bounds = [search.bound(s) for s in structures]
    order = sorted(range(total), key=lambda i: (bounds[i], i))
    pending: list[tuple[float, int, int, _Found]] = []
    done = 0
    while True:
        while done < total and (not pending or bounds[order[done]] <= pending[0][0]):
            i = order[done]
            for k, c in enumerate(search.found(structures[i])):
                heapq.heappush(pending, (c.estimate, i, k, c))
            done += 1
            if progress:
                progress(done, total)
        if not pending:
            return
        yield heapq.heappop(pending)[3].candidate(search.opts)


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
    # exhaustive structures are few enough to simulate every one; otherwise the estimate prunes
    if opts.top_k:
        top_k = opts.top_k
    elif len(cluster.devices) <= EXHAUSTIVE_DEVICES and len(structures) <= EXHAUSTIVE_STRUCTURES:
        top_k = 0  # every candidate
    else:
        top_k = 8 if len(cluster.devices) <= 16 else 3
    scored: list[Candidate] = []
    seen: set[str] = set()
    for c in _ranked(search, structures, top_k, progress):
        key = str(c.plan.to_dict()["pipelines"])
        if key in seen:
            continue
        seen.add(key)
        c.sim = simulate_or_none(c.plan, profile, cluster)
        if c.sim is not None:
            scored.append(c)
        if top_k and len(scored) >= top_k:
            break
    if progress:
        progress(len(structures), len(structures))  # the rest are bounded out, never evaluated
    return Searched(search=search, structures=len(structures), scored=scored)


def best_plan(
    searched: Searched,
    baselines: dict[str, Candidate | None],
    profile: ModelProfile,
    cluster: Cluster,
    opts: PlanOptions,
    *,
    lower_bound: float | None = None,
) -> PlanResult:
    """Step 4: the fastest of the searched candidates and the baselines, refined, with its bound
    (``lower_bound``: the bound already computed, see :func:`lower_bound`; math.nan where the
    caller reads only the plan)."""
    pool = searched.scored + [b for b in baselines.values() if b is not None and b.sim is not None]
    if not pool:
        raise _infeasible(profile, cluster, opts, searched.search.tables)
    best = min(pool, key=lambda c: c.sim.iteration_s)
    search = searched.search
    if opts.refine:
        # small clusters: hill-climb from the few best simulated candidates, not only the winner; the
        # closed form that picked each one's cuts and shares can misjudge which structure wins
        small = len(cluster.devices) <= _LOCAL_SEARCH_DEVICES
        ranked = sorted(pool, key=lambda c: c.sim.iteration_s)
        if not small:
            ranked = ranked[:1]
        budget = [_REFINE_TASKS]  # simulated tasks, shared: deterministic, unlike a time limit
        refined = [
            _refine(c, profile, cluster, search.tables, local_search=small, budget=budget, sizes=search.sizes)
            for c in ranked
        ]
        best = min(refined, key=lambda c: c.sim.iteration_s)
    best, zero_alternative = _settle_zero(best, profile, cluster)
    if lower_bound is None:
        lower_bound = compute_lower_bound(search.tables, cluster, opts.global_batch, list(search.sizes))
    return PlanResult(
        plan=best.plan,
        sim=best.sim,
        lower_bound_s=lower_bound,
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
    if profile.shared:  # ZeRO-1 refuses tied parameters (check_shared_parameters)
        return best, None if single else {"tied": ", ".join(entry.name for entry in profile.shared)}
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


def search_only(profile: ModelProfile, cluster: Cluster, opts: PlanOptions, *, bound: bool = True) -> PlanResult:
    """The planner without baselines (what a baseline that runs a planner of its own calls);
    without ``bound`` its ``lower_bound_s`` is NaN (a baseline reads only the plan, and the LP
    would import scipy where nothing else needs it)."""
    lower = None if bound else math.nan
    return best_plan(search_plans(profile, cluster, opts), {}, profile, cluster, opts, lower_bound=lower)


def plan_details(result: PlanResult, cluster: Cluster) -> dict[str, Any]:
    """The plan file's ``details``: bound, gap, idle devices, runners-up."""
    used = set(result.plan.all_devices())
    idle = [d.address for d in cluster.devices if d.address not in used]
    best = result.sim.iteration_s
    runners = []
    seen: set[str] = {result.label}
    for c in sorted(result.candidates, key=lambda c: c.sim.iteration_s):
        # the winner in another form (a replicated stage for two one-device pipelines: the same
        # iteration) or a second candidate of a structure already listed says nothing new
        if c.label in seen or round(c.sim.iteration_s / best - 1, 6) <= 0:
            continue
        seen.add(c.label)
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

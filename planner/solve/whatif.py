"""What-if: which nodes to add, drop or rent, by branch and bound over node counts with the planner.

    space = what_if_space(base_cluster, base_data, pool)
    result = what_if(profile, space, PlanOptions(global_batch=1024), Objective("cheapest-per-step"))
    result.chosen.counts, result.chosen.iteration_s, result.chosen.usd_per_step

A *candidate* is a count of nodes per *kind*: each group of identical nodes of the base cluster
(0 up to as many as it has: a node may be dropped) and each pool entry (0 up to its ``count``). A
candidate's answer is what a cheaper run of the planner's search gives on that cluster
(:func:`candidate_options`: no baselines, no refinement, the estimate's best plan simulated; the
full planner costs seconds to minutes per candidate), and only the chosen candidate is planned
once more in full (:func:`final_options`), as ``hetplan plan`` would. The search never plans every
candidate. It ranks them by a lower bound on their objective and plans them best bound first,
stopping when no bound left can beat the best plan found:

* the bound on the iteration time is the planner's own LP bound (no plan is faster), from tables
  built once for the pool (:mod:`hetplan.solve.whatif_bounds`): first points of the LP's dual for
  every candidate at once (never above the LP), then, for a candidate about to be planned, the LP
  itself, memoised per type counts, whose dual point then raises every other candidate's bound;
* an objective is a function of (iteration time, $/hour) that never falls as the time grows, so a
  bound on the time bounds it; constraints prune on the bound too (a candidate whose bound misses
  a deadline cannot meet it; one over the budget per hour is never planned);
* between best-bound steps the search *dives*: plans neighbours of the best plan found that could
  still beat it (only the order changes, so a good answer comes early when ``max_plans`` stops it).

Ties are broken by price, then devices, then the counts, so the answer is unique and the same as
planning every candidate (``tests/solve/test_whatif.py`` checks that against brute force). The
search is exact over its candidate counts; where a kind offers more than ``ladder`` nodes, its counts
are a ladder (every count up to a few, then powers of two and the maximum), stated in the result.
"""

from __future__ import annotations

import copy
import heapq
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hetplan.contracts.catalog import Catalog, load_catalog
from hetplan.contracts.cluster import Cluster, parse_cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.pool import Pool
from hetplan.errors import HetplanError
from hetplan.solve.search import PlanOptions, PlanResult
from hetplan.solve.tables import CostTables
from hetplan.solve.training import plan_training
from hetplan.solve.whatif_bounds import CandidateBounds

__all__ = [
    "OBJECTIVES",
    "Evaluated",
    "Kind",
    "Objective",
    "Space",
    "WhatIfResult",
    "candidate_options",
    "final_options",
    "what_if",
    "what_if_space",
]

#: What to optimise. Per step, per sample and per run differ only by a constant factor at one batch
#: size, so they pick the same candidate; each is named so the table leads with its figure.
OBJECTIVES = (
    "fastest",
    "cheapest-per-step",
    "cheapest-per-sample",
    "cheapest-run",
    "cheapest-meeting",
    "fastest-within-budget",
)

#: Up to this many candidates every count of every kind is tried; above, large kinds take ladders.
MAX_CANDIDATES = 200_000

#: Candidates are planned by the search with only the estimate's best this many plans simulated
#: (and no refinement, no baselines); the chosen one is planned in full. The planner simulates
#: every structure's plan on a cluster of up to a few devices, which at a large batch (hundreds
#: of micro-batches) costs minutes per candidate; the estimate's best is its pick on large ones.
CANDIDATE_TOP_K = 1


#: Of every this many candidates planned, one is the best bound left and the others dive (a
#: neighbour of the best plan found that could still beat it) while a dive is open.
DIVE_EVERY = 3


#: The chosen candidate is planned as ``hetplan plan`` plans it (baselines, refinement, the
#: planner's ``top_k``) where its candidate plan is small: devices x simulated tasks at most this.
#: Above, its search simulates only the estimate's best :data:`FINAL_TOP_K` (baselines and
#: refinement still run): on a few devices the planner simulates every structure's plan, which at
#: a batch of hundreds of micro-batches takes minutes (4 T4s at batch 1024: about 4 minutes).
FULL_PLAN_WORK = 4_000
FINAL_TOP_K = 1


def candidate_options(opts: PlanOptions) -> PlanOptions:
    """The options every candidate is planned with: ``opts`` without baselines and refinement, and
    with ``top_k`` at :data:`CANDIDATE_TOP_K` unless ``opts`` sets one."""
    return replace(opts, baselines=False, refine=False, top_k=opts.top_k or CANDIDATE_TOP_K)


def final_options(opts: PlanOptions, chosen: Evaluated | None = None) -> PlanOptions:
    """The options the chosen candidate is planned with: ``opts`` as given, or with ``top_k`` at
    :data:`FINAL_TOP_K` where ``opts`` sets none and ``chosen``'s plan is above :data:`FULL_PLAN_WORK`."""
    if opts.top_k or chosen is None or chosen.result is None:
        return opts
    if chosen.devices * chosen.result.sim.n_tasks <= FULL_PLAN_WORK:
        return opts
    return replace(opts, top_k=FINAL_TOP_K)


@dataclass(frozen=True)
class Kind:
    """A group of identical nodes: ``hi`` of them at most, ``base`` of them in the base cluster."""

    name: str
    data: dict[str, Any]  # the node as a cluster file writes it (no name)
    devices: dict[str, int]  # device type -> devices per node
    price_per_hour: float | None  # one node
    hi: int
    base: int
    names: tuple[str, ...]  # node names, in the order nodes are kept or added
    pool: bool

    @property
    def per_node_devices(self) -> int:
        return sum(self.devices.values())

    def describe(self) -> str:
        inside = " + ".join(f"{n} x {t}" for t, n in self.devices.items())
        where = "pool" if self.pool else "cluster"
        price = f"${self.price_per_hour:g}/h" if self.price_per_hour is not None else "no price"
        return f"{self.name}: {inside} per node, {self.hi} available ({where}), {price} per node"


@dataclass(frozen=True)
class Space:
    """The candidates: a count per kind, each within ``levels[k]``."""

    kinds: tuple[Kind, ...]
    base_data: dict[str, Any]
    catalog: Catalog
    levels: tuple[tuple[int, ...], ...]

    @property
    def base_counts(self) -> tuple[int, ...]:
        return tuple(k.base for k in self.kinds)

    @property
    def laddered(self) -> bool:
        return any(len(lv) != k.hi + 1 for k, lv in zip(self.kinds, self.levels, strict=True))

    def size(self) -> int:
        return math.prod(len(lv) for lv in self.levels) - (1 if all(0 in lv for lv in self.levels) else 0)

    def price_per_hour(self, counts: tuple[int, ...]) -> float | None:
        total = 0.0
        for k, c in zip(self.kinds, counts, strict=True):
            if c and k.price_per_hour is None:
                return None
            total += c * (k.price_per_hour or 0.0)
        return round(total, 9)

    def moved(self, counts: tuple[int, ...]) -> int:
        """Nodes added or dropped from the cluster as it is."""
        return sum(abs(c - k.base) for k, c in zip(self.kinds, counts, strict=True))

    def devices(self, counts: tuple[int, ...]) -> int:
        return sum(c * k.per_node_devices for k, c in zip(self.kinds, counts, strict=True))

    def type_counts(self, counts: tuple[int, ...]) -> dict[str, int]:
        out: dict[str, int] = {}
        for k, c in zip(self.kinds, counts, strict=True):
            for t, n in k.devices.items():
                out[t] = out.get(t, 0) + c * n
        return {t: n for t, n in out.items() if n}

    def cluster_data(self, counts: tuple[int, ...]) -> dict[str, Any]:
        """The candidate as a cluster file: the base's network, the kept and added nodes in kind order."""
        data = copy.deepcopy(self.base_data)
        nodes = []
        for k, c in zip(self.kinds, counts, strict=True):
            for name in k.names[:c]:
                nodes.append({"name": name, **copy.deepcopy(k.data)})
        data["nodes"] = nodes
        kept = {n["name"] for n in nodes}
        network = data.get("network")
        if isinstance(network, dict):
            groups = [dict(g, nodes=[n for n in g["nodes"] if n in kept]) for g in network.get("groups", [])]
            groups = [g for g in groups if len(set(g["nodes"])) >= 2]
            overrides = [o for o in network.get("overrides", []) if all(n in kept for n in o["between"])]
            for key, value in (("groups", groups), ("overrides", overrides)):
                if key in network:
                    network[key] = value
        present = set(self.type_counts(counts))
        if isinstance(data.get("reserve"), dict):
            data["reserve"] = {t: r for t, r in data["reserve"].items() if t in present}
            if not data["reserve"]:
                del data["reserve"]
        label = ", ".join(f"{k.name} {c}" for k, c in zip(self.kinds, counts, strict=True))
        data["name"] = f"{self.base_data.get('name', 'cluster')} what-if ({label})"
        return data

    def cluster(self, counts: tuple[int, ...]) -> Cluster:
        return parse_cluster(self.cluster_data(counts), file="<what-if candidate>", catalog=self.catalog)


def _ladder(hi: int, steps: int) -> tuple[int, ...]:
    """Every count up to ``steps // 2``, then powers of two, and ``hi`` itself."""
    levels = set(range(min(hi, steps // 2) + 1)) | {hi}
    p = 1
    while p < hi:
        levels.add(p)
        p *= 2
    return tuple(sorted(levels))


def what_if_space(base: Cluster, base_data: dict[str, Any], pool: Pool | None, *, ladder: int = 0) -> Space:
    """Kinds from the base cluster (identical nodes grouped, in file order) and the pool.

    ladder: if above 0, a kind with more nodes than this takes a ladder of counts; 0: every count
    unless the space exceeds :data:`MAX_CANDIDATES` (then the ladder widens until it fits)."""
    kinds: list[Kind] = []
    groups: dict[str, list[int]] = {}
    raw_nodes = base_data["nodes"]
    for i, node in enumerate(raw_nodes):
        key = json.dumps({k: v for k, v in node.items() if k != "name"}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    for indices in groups.values():
        first = base.nodes[indices[0]]
        names = tuple(base.nodes[i].name for i in indices)
        label = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]}"
        kinds.append(
            Kind(
                name=label,
                data={k: v for k, v in raw_nodes[indices[0]].items() if k != "name"},
                devices=_device_counts(first.devices),
                price_per_hour=base.node_price(first),
                hi=len(indices),
                base=len(indices),
                names=names,
                pool=False,
            )
        )
    taken = {n.name for n in base.nodes}
    for p in pool.nodes if pool else ():
        names = tuple(f"{p.name}-{i}" for i in range(p.count))
        clash = taken & set(names)
        if clash:
            raise HetplanError(
                f"pool node names {', '.join(sorted(clash))} clash with the cluster's; rename the pool entry",
                file=pool.file,
                field="nodes",
            )
        taken |= set(names)
        data = {k: v for k, v in p.data.items() if k != "name"}
        kinds.append(
            Kind(
                name=p.name,
                data=data,
                devices=_device_counts(p.node.devices),
                price_per_hour=p.price_per_hour,
                hi=p.count,
                base=0,
                names=names,
                pool=True,
            )
        )
    steps = ladder
    while True:
        levels = tuple(_ladder(k.hi, steps) if steps and k.hi > steps else tuple(range(k.hi + 1)) for k in kinds)
        if math.prod(len(lv) for lv in levels) <= MAX_CANDIDATES or steps == 2:
            break
        steps = max(2, (steps or 64) // 2)
    return Space(kinds=tuple(kinds), base_data=base_data, catalog=load_catalog(), levels=levels)


def _device_counts(devices) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in devices:
        out[d.type.name] = out.get(d.type.name, 0) + 1
    return out


@dataclass(frozen=True)
class Objective:
    """What to minimise, and the constraints a candidate must meet.

    max_iteration_s: a throughput or deadline as the slowest iteration allowed.
    budget_per_hour: the most $/hour the cluster may cost.
    run_samples: samples in the whole run ($/run and hours per run; ``cheapest-run`` needs it).
    """

    name: str = "fastest"
    max_iteration_s: float | None = None
    budget_per_hour: float | None = None
    run_samples: int | None = None

    @property
    def priced(self) -> bool:
        return self.name.startswith("cheapest") or self.budget_per_hour is not None

    def key(self, t: float, price: float | None, devices: int, moved: int, counts: tuple[int, ...]) -> tuple:
        """The order candidates are ranked in; every entry never falls as ``t`` grows. Ties go to
        fewer devices, then fewer nodes moved from the cluster as it is, then the counts."""
        if self.name.startswith("cheapest"):
            return (price * t, t, devices, moved, counts)
        return (t, price if price is not None else 0.0, devices, moved, counts)


@dataclass
class Evaluated:
    """One planned candidate."""

    counts: tuple[int, ...]
    devices: int
    price_per_hour: float | None
    bound_s: float
    result: PlanResult | None = None
    cluster: Cluster | None = None
    reason: str = ""  # why there is no plan
    candidate_s: float | None = None  # the chosen one: its candidate plan's iteration, before the full plan

    @property
    def iteration_s(self) -> float:
        return self.result.sim.iteration_s if self.result else math.inf

    @property
    def compared_s(self) -> float:
        """The iteration to compare with other candidates' (planned alike, by :func:`candidate_options`)."""
        return self.candidate_s if self.candidate_s is not None else self.iteration_s

    @property
    def usd_per_step(self) -> float | None:
        if self.result is None or self.price_per_hour is None:
            return None
        return self.price_per_hour * self.iteration_s / 3600.0

    @property
    def used_devices(self) -> int:
        if self.result is None:
            return 0
        return sum(len(p.devices()) for p in self.result.plan.pipelines)


@dataclass
class WhatIfResult:
    space: Space
    objective: Objective
    global_batch: int
    chosen: Evaluated | None
    evaluated: dict[tuple[int, ...], Evaluated]
    candidates: int
    pruned: int  # candidates never planned because a bound ruled them out
    exact: bool  # False: stopped at max_plans with bounds left that could still win
    gap: float | None  # then: the best bound left below the answer, as a fraction
    marginals: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _neighbours(row: int, index: np.ndarray, where: dict[tuple[int, ...], int]) -> list[int]:
    """Candidates one ladder step away from ``row`` in one kind's count, or with none of a kind
    (rows of the grid)."""
    out = []
    for k in range(index.shape[1]):
        for level in {index[row, k] - 1, index[row, k] + 1, 0} - {index[row, k]}:
            moved = index[row].copy()
            moved[k] = level
            other = where.get(tuple(int(i) for i in moved))
            if other is not None:
                out.append(other)
    return sorted(out)


def what_if(
    profile: ModelProfile,
    space: Space,
    opts: PlanOptions,
    objective: Objective,
    *,
    max_plans: int | None = None,
    marginals: bool = True,
    plan: Callable[[ModelProfile, Cluster, PlanOptions], PlanResult] = plan_training,
    progress: Callable[[int, tuple[int, ...]], None] | None = None,
) -> WhatIfResult:
    """The best candidate for ``objective``: planned best bound first until no bound can beat it.

    Args:
        max_plans: stop after planning this many candidates (the result says how far from proven).
        marginals: also plan one node more and one less of each kind than the answer.
        plan: the planner (``plan_training``; tests pass the same function to brute force).
    Returns:
        :class:`WhatIfResult`; ``chosen`` is None when no candidate has a plan that meets the objective.

    Note: candidates are planned by the search alone, at :func:`candidate_options` (no baselines,
    no refinement, only the estimate's best :data:`CANDIDATE_TOP_K` simulated): the full planner
    costs seconds to minutes per candidate. The chosen candidate is then planned with ``opts`` as
    given (``hetplan plan`` on its cluster), and its figures are that plan's where it is no slower.

    Which candidate is planned next: the best bound, alternating with a *dive* where one is open,
    a neighbour (one ladder step in one kind's count) of the best plan found whose bound can still
    beat it, best bound first. Both only choose the order; every candidate left unplanned has a
    bound that cannot beat the answer (or ``max_plans`` stopped the search, and ``gap`` says by how
    much the best bound left lies below the answer), so the answer is the same as planning them all.
    """
    if objective.name not in OBJECTIVES:
        raise HetplanError(f"unknown objective {objective.name!r}; expected one of {', '.join(OBJECTIVES)}")
    if objective.priced:
        unpriced = [k.name for k in space.kinds if k.price_per_hour is None]
        if unpriced:
            raise HetplanError(
                f"objective {objective.name} needs a price for every node; none known for {', '.join(unpriced)} "
                "(set price_per_hour on the node, or price: in the catalog)",
                field="--objective",
            )
    search_opts = candidate_options(opts)
    types = sorted({t for k in space.kinds for t in k.devices})
    sizes = sorted(set(opts.micro_batch_sizes or tuple(2**k for k in range(7))))
    everything = space.cluster(tuple(k.hi for k in space.kinds))
    tables = CostTables(profile, everything, optimizer=opts.optimizer)
    lower = CandidateBounds(profile, tables, types, sizes, opts.global_batch)
    index = np.array(np.meshgrid(*[range(len(lv)) for lv in space.levels], indexing="ij"))
    index = index.reshape(len(space.kinds), -1).T
    grid = np.array([[lv[i] for lv, i in zip(space.levels, row, strict=True)] for row in index], dtype=int)
    keep = grid.sum(axis=1) > 0
    grid, index = grid[keep], index[keep]
    per_type = np.zeros((grid.shape[0], len(types)))
    for ki, kind in enumerate(space.kinds):
        for t, per in kind.devices.items():
            per_type[:, types.index(t)] += grid[:, ki] * per
    groups = lower.groups(per_type)
    bound = lower.fast(per_type, groups)
    where = {tuple(int(i) for i in row): r for r, row in enumerate(index)}
    counts_of = [tuple(int(c) for c in row) for row in grid]
    prices = [space.price_per_hour(c) for c in counts_of]
    devices = per_type.sum(axis=1).astype(int)
    lp_done = np.zeros(grid.shape[0], dtype=bool)
    planned = np.zeros(grid.shape[0], dtype=bool)
    alive = np.ones(grid.shape[0], dtype=bool)  # not ruled out by a constraint

    def key(r: int) -> tuple:
        c = counts_of[r]
        return objective.key(float(bound[r]), prices[r], int(devices[r]), space.moved(c), c)

    def tighten(r: int) -> None:
        """Row ``r``'s bound raised to its LP; the LP's dual point raises every other row's."""
        if lp_done[r]:
            return
        cuts = lower.cuts
        lp = lower.lp(space.type_counts(counts_of[r]))
        if lower.cuts > cuts:
            np.maximum(bound, lower.fast(per_type, groups, since=cuts), out=bound)
        bound[r] = max(bound[r], lp)  # both are lower bounds: keep the larger
        lp_done[r] = True

    heap: list[tuple[tuple, int]] = []
    for r in range(grid.shape[0]):
        over_budget = objective.budget_per_hour is not None and prices[r] > objective.budget_per_hour + 1e-9
        too_slow = objective.max_iteration_s is not None and bound[r] > objective.max_iteration_s
        if over_budget or too_slow:
            alive[r] = False
        else:
            heap.append((key(r), r))
    heapq.heapify(heap)

    evaluated: dict[tuple[int, ...], Evaluated] = {}

    def evaluate(counts: tuple[int, ...], bound_s: float = 0.0) -> Evaluated:
        if counts in evaluated:
            return evaluated[counts]
        cluster = space.cluster(counts)
        ev = Evaluated(counts, space.devices(counts), space.price_per_hour(counts), bound_s)
        try:
            ev.result = plan(profile, cluster, search_opts)
            ev.cluster = cluster
        except HetplanError as exc:
            ev.reason = exc.reason
        evaluated[counts] = ev
        if progress is not None:
            progress(len(evaluated), counts)
        return ev

    best: tuple[tuple, Evaluated] | None = None
    dive: list[tuple[int, tuple, int]] = []  # neighbours of the best plan found, best bound first

    def open_dive(r: int) -> None:
        dive.clear()
        for other in _neighbours(r, index, where):
            if planned[other] or not alive[other]:
                continue
            tighten(other)
            if objective.max_iteration_s is not None and bound[other] > objective.max_iteration_s:
                continue
            if key(other) < best[0]:
                # priced objectives: fewer devices first (what the bound ignores, bubbles, small
                # micro-batches, communication, grows with them); otherwise the best bound first
                first = int(devices[other]) if objective.priced else 0
                dive.append((first, key(other), other))
        dive.sort(reverse=True)  # pop() takes the first

    def next_row() -> int | None:
        """The next row to plan, or None when no bound left can beat the best plan found."""
        while heap:
            k, r = heap[0]
            if planned[r] or not alive[r]:
                heapq.heappop(heap)
                continue
            if k != key(r) or not lp_done[r]:
                heapq.heappop(heap)
                if k == key(r):  # a key raised by another LP's dual point is re-queued without its own
                    tighten(r)
                if objective.max_iteration_s is not None and bound[r] > objective.max_iteration_s:
                    alive[r] = False
                    continue
                heapq.heappush(heap, (key(r), r))
                continue
            if best is not None and k >= best[0]:
                return None
            if dive and len(evaluated) % DIVE_EVERY:
                while dive:
                    _, dk, d = dive.pop()
                    if not planned[d] and alive[d] and dk < best[0]:
                        return d
            return heapq.heappop(heap)[1]
        return None

    exact = True
    gap = None
    while True:
        if max_plans is not None and len(evaluated) >= max_plans:
            r = next_row()
            if r is not None:
                exact = False
                left = min(key(i)[0] for _, i in heap if not planned[i] and alive[i])
                if best is not None:
                    gap = 1.0 - left / best[0][0] if best[0][0] > 0 else 0.0
            break
        r = next_row()
        if r is None:
            break
        planned[r] = True
        ev = evaluate(counts_of[r], float(bound[r]))
        if ev.result is None:
            continue
        t = ev.iteration_s
        if objective.max_iteration_s is not None and t > objective.max_iteration_s:
            continue
        true_key = objective.key(t, ev.price_per_hour, ev.devices, space.moved(ev.counts), ev.counts)
        if best is None or true_key < best[0]:
            best = (true_key, ev)
            open_dive(r)
    chosen = best[1] if best else None
    if chosen is not None and search_opts != final_options(opts, chosen):
        _plan_in_full(chosen, profile, final_options(opts, chosen), plan)
    result = WhatIfResult(
        space=space,
        objective=objective,
        global_batch=opts.global_batch,
        chosen=chosen,
        evaluated=evaluated,
        candidates=len(grid),
        pruned=0,
        exact=exact,
        gap=gap,
    )
    if chosen is not None and marginals:
        result.marginals = _marginals(space, chosen, evaluate)
    # never planned: ruled out by a constraint on the bound, or (the search ran to its end) by the bound
    unplanned = np.array([c not in evaluated for c in counts_of], dtype=bool)
    result.pruned = int((unplanned if exact else unplanned & ~alive).sum())
    result.notes = _notes(result)
    return result


def _plan_in_full(chosen: Evaluated, profile: ModelProfile, opts: PlanOptions, plan: Callable[..., PlanResult]) -> None:
    """``chosen`` planned as ``hetplan plan`` plans its cluster (the baselines compete too), kept
    where it is no slower than the search-only plan (refinement shares one budget among more
    starting points, so in rare cases it is not): the answer still meets every limit checked."""
    if chosen.cluster is None:
        return
    full = plan(profile, chosen.cluster, opts)
    chosen.candidate_s = chosen.iteration_s
    if full.sim.iteration_s <= chosen.iteration_s:
        chosen.result = full


def _marginals(space: Space, chosen: Evaluated, evaluate: Callable[[tuple[int, ...]], Evaluated]) -> list[dict]:
    """One node more and one node less of each kind than the answer: time, $/h and $/step deltas."""
    rows = []
    for ki, kind in enumerate(space.kinds):
        for delta in (+1, -1):
            c = chosen.counts[ki] + delta
            if c < 0 or c > kind.hi:
                continue
            counts = tuple(c if i == ki else n for i, n in enumerate(chosen.counts))
            if sum(counts) == 0:
                continue
            ev = evaluate(counts)
            rows.append({"kind": kind.name, "delta": delta, "evaluated": ev})
    return rows


def _notes(result: WhatIfResult) -> list[str]:
    """Plain sentences: a node kind whose extra node makes the plan slower (dropping it wins), idle
    devices. Neighbours are compared with the chosen candidate's own plan, planned as they were."""
    notes = []
    chosen = result.chosen
    if chosen is None:
        return ["no candidate has a plan that fits and meets the objective"]
    here = chosen.compared_s
    for row in result.marginals:
        ev = row["evaluated"]
        kind = row["kind"]
        if row["delta"] == +1 and ev.result is not None and ev.iteration_s >= here - 1e-12:
            verb = "slower" if ev.iteration_s > here * (1 + 1e-9) else "no faster"
            notes.append(
                f"adding a {kind} node makes the plan {verb} ({here:.4g} s -> {ev.iteration_s:.4g} s): dropping it wins"
            )
        if row["delta"] == -1 and ev.result is not None and ev.iteration_s <= here * (1 + 1e-9):
            notes.append(f"dropping a {kind} node is no slower ({here:.4g} s -> {ev.iteration_s:.4g} s)")
    if chosen.result is not None and chosen.used_devices < chosen.devices:
        notes.append(f"the chosen plan leaves {chosen.devices - chosen.used_devices} of {chosen.devices} devices idle")
    if result.space.laddered:
        notes.append(
            "counts per kind searched on a ladder: "
            + "; ".join(
                f"{k.name} {list(lv)}"
                for k, lv in zip(result.space.kinds, result.space.levels, strict=True)
                if len(lv) != k.hi + 1
            )
        )
    return notes

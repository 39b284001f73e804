"""Exact partition of a block sequence over an ordered list of stage slots, each stage also choosing
its tensor-parallel degree and recomputation.

    slots = [Slot.of([a100]), Slot.of([v100, v100])]      # stage order fixed by the caller
    best = partition(tables, slots, m=4, n_micro=16, schedule="1f1b", links=[link01])
    best.cuts            # [0, 31, 50]: stage s runs blocks [cuts[s], cuts[s+1])
    best.options         # ((1, "none"), (2, "selective")): each stage's TP degree and recomputation
    best.bottleneck      # the slowest per-micro-batch cycle (a stage, or a cut's transfer)

A slot is ``w`` devices. When they are one type on one node, the stage may run them as ``w / t``
replicas of a tensor-parallel group of ``t`` devices, for every ``t`` dividing ``w`` that the blocks
have (:meth:`CostTables.tp_options`); otherwise (or at ``t = 1``) each device is a replica. Each
(degree, recomputation) pair is an *option*: for every block range, the stage's time is the fastest
option that fits in memory (:meth:`CostTables.stage_time` prices it, :meth:`CostTables.fits`
filters it), so the DP below is unchanged: only its per-stage cost matrix is the minimum over
options. Recomputation never makes a stage faster, so its options are priced only where a range
does not fit without it.

The objective is the pipeline's time for ``M`` micro-batches, ``(M - 1) x bottleneck + total``: the
bottleneck (the slowest stage or boundary transfer per micro-batch) sets the steady-state rate, the
total (every stage and transfer once) is the fill and drain. It is minimised exactly: a min-max DP
gives the smallest bottleneck; then, for each larger candidate bottleneck (every distinct stage or
transfer time, ascending), a min-sum DP under that cap, stopping once ``(M - 1) x cap`` plus the
smallest possible total can no longer win. From 9 micro-batches on only the first, lexicographic
step is taken (the bottleneck term dominates; see ``_NO_PRUNE_LIMIT``). Each DP is O(S n^2) over
contiguous block ranges, with every stage's memory (weights, gradients, optimizer state, activations
of the micro-batches it holds under the schedule) as a hard constraint.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetplan.contracts.cluster import Device, Link
from hetplan.contracts.plan import RECOMPUTE, split_micro_batch
from hetplan.simulate.costs import block_costs
from hetplan.solve.range_memory import RangeTerms, range_terms
from hetplan.solve.tables import CostTables

__all__ = [
    "Option",
    "Partition",
    "Slot",
    "SlotCosts",
    "default_tp_link",
    "in_flight",
    "partition",
    "slot_times",
]

# From this many micro-batches on, the min-max solution (with the smallest total among those) is
# kept as is: the cap enumeration costs a DP per candidate cap and, with the bottleneck weighted this
# heavily, almost never finds better; below it the objective is minimised exactly.
_NO_PRUNE_LIMIT = 8

#: A stage's (tensor-parallel degree, recomputation).
Option = tuple[int, str]
_BASE: Option = (1, "none")


@dataclass(frozen=True)
class Slot:
    """The devices of one stage and each one's share of every micro-batch (at degree 1)."""

    devices: tuple[Device, ...]
    shares: tuple[float, ...]

    @staticmethod
    def of(devices: list[Device] | tuple[Device, ...], shares: tuple[float, ...] | None = None) -> Slot:
        devices = tuple(devices)
        return Slot(devices, shares or tuple(1.0 / len(devices) for _ in devices))

    @property
    def one_group(self) -> bool:
        """All devices one type on one node: they may form tensor-parallel groups."""
        return len({(d.node, d.type.name) for d in self.devices}) == 1

    def degrees(self) -> tuple[int, ...]:
        """Tensor-parallel degrees the slot's devices can form (before asking the profile)."""
        w = len(self.devices)
        if not self.one_group:
            return (1,)
        return tuple(t for t in range(1, w + 1) if w % t == 0)

    def replica_shares(self, tp: int) -> tuple[float, ...]:
        """Shares per replica at degree ``tp``: the slot's own at 1, equal otherwise."""
        if tp == 1:
            return self.shares
        k = len(self.devices) // tp
        return tuple(1.0 / k for _ in range(k))


@dataclass(frozen=True)
class Partition:
    cuts: tuple[int, ...]
    stage_times: tuple[float, ...]  # fwd + bwd per micro-batch
    comm_times: tuple[float, ...]  # per cut, one direction, per micro-batch
    bottleneck: float
    total: float
    options: tuple[Option, ...] = ()  # per stage: (TP degree, recomputation); empty means all (1, "none")
    memory_bound: bool = False  # a faster option of some chosen stage did not fit in memory
    replicated: bool = False  # some stage splits each micro-batch over replicas (a small one uses fewer)

    def estimate(self, n_micro: int) -> float:
        """Closed-form pipeline time (pruning only; the simulator is the truth)."""
        return (n_micro - 1) * self.bottleneck + self.total

    def option(self, stage: int) -> Option:
        return self.options[stage] if self.options else _BASE


def in_flight(schedule: str, stage: int, n_stages: int, n_micro: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at its peak."""
    return n_micro if schedule == "gpipe" else min(n_stages - stage, n_micro)


class SlotCosts:
    """Per-option time and memory matrices of slots, cached across a whole search.

    ``tp_link(slot)`` is the link a tensor-parallel group of the slot all-reduces over (its node's);
    ``allowed`` (per block, the degrees a block may take; None: any) is how the search makes every
    pipeline agree on one degree per block.
    """

    def __init__(self, tables: CostTables, tp_link) -> None:
        self.tables = tables
        self.tp_link = tp_link
        n = tables.n
        self._valid = np.arange(n + 1)[:, None] < np.arange(n + 1)[None, :]
        self._times: dict[tuple, np.ndarray] = {}
        self._fits: dict[tuple, np.ndarray] = {}
        self._terms: dict[tuple, RangeTerms] = {}
        self._matrices: dict[tuple, tuple] = {}
        self._usable_cache: dict[tuple, np.ndarray] = {}
        self._time_cache: dict[tuple, np.ndarray] = {}
        self._has: dict[int, np.ndarray] = {}
        self.recompute = RECOMPUTE

    def has_degree(self, tp: int) -> np.ndarray:
        """Prefix counts of blocks lacking degree ``tp`` (a range has it where the count is unchanged)."""
        if tp not in self._has:
            lack = [0.0 if tp in self.tables.tp_options(b, b + 1) else 1.0 for b in range(self.tables.n)]
            self._has[tp] = np.concatenate([[0.0], np.cumsum(lack)])
        return self._has[tp]

    def prefix(self, type_name: str, count: int, option: Option, link: Link | None) -> np.ndarray:
        """Cumulative seconds of blocks ``[0, i)`` for one replica of ``count`` samples (NaN-free:
        blocks lacking the degree cost 0 here and are excluded by :meth:`has_degree`)."""
        key = (type_name, count, option, None if option[0] == 1 else (link.bandwidth, link.latency))
        if key not in self._times:
            tp, recompute = option
            if option == _BASE:
                self._times[key] = self.tables.prefix(type_name, count)
            else:
                # per block from the formula the tables and the simulator share; a block lacking the
                # degree is NaN there, 0 here (ranges holding it are excluded by has_degree)
                fwd, bwd = block_costs(
                    self.tables.profile,
                    self.tables.device_type(type_name),
                    count,
                    tp=tp,
                    recompute=recompute,
                    link=link if tp > 1 else None,
                    collective_efficiency=self.tables.cluster.collective_efficiency,
                )
                per_block = np.nan_to_num(np.asarray(fwd) + np.asarray(bwd), nan=0.0)
                self._times[key] = np.concatenate([[0.0], np.cumsum(per_block)])
        return self._times[key]

    def fits(
        self, device: Device, count: int, held: int, option: Option, zero_holders: int, shared: bool
    ) -> np.ndarray:
        """``fits[i, j]``: can one replica of ``count`` samples hold blocks ``[i, j)`` with ``held``
        micro-batches in flight (an (n+1) x (n+1) boolean matrix; ``shared``: another device
        holds the blocks too, so their gradients pass through all-reduce buckets)."""
        key = (device.type.name, count, held, option, zero_holders, shared)
        if key not in self._fits:
            tkey = (option, zero_holders)
            if tkey not in self._terms:
                self._terms[tkey] = range_terms(
                    self.tables.profile,
                    optimizer=self.tables.optimizer,
                    tp=option[0],
                    recompute=option[1],
                    zero_holders=zero_holders,
                )
            need = self._terms[tkey].memory(m=count, in_flight=held, shared=shared)
            self._fits[key] = need <= device.type.usable_tensor_bytes
        return self._fits[key]

    def stage_matrix(
        self,
        slot: Slot,
        m: int,
        held: int,
        *,
        pipelines: int,
        zero: bool,
        allowed: tuple[frozenset[int], ...] | None,
        recompute_cap: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray, list[Option], np.ndarray, bool]:
        """Per range, the fastest fitting option's per-micro-batch time (inf: none fits), the index
        of that option in the returned list, the fastest time ignoring memory, and whether some
        usable range did not fit without recomputation. Recomputation options are priced only with
        ``recompute_cap`` (ranges at least that slow are left out: they cannot win)."""
        link = self.tp_link(slot)
        key = (
            tuple((d.node, d.type.name) for d in slot.devices),
            slot.shares,
            None if link is None else (link.bandwidth, link.latency),
            m,
            held,
            pipelines,
            zero,
            allowed,
            recompute_cap,
        )
        if key not in self._matrices:
            self._matrices[key] = self._stage_matrix(slot, link, m, held, pipelines, zero, allowed, recompute_cap)
        return self._matrices[key]

    def _usable(self, tp: int, allowed: tuple[frozenset[int], ...] | None) -> np.ndarray:
        """Ranges whose every block has degree ``tp`` (and may take it, under ``allowed``)."""
        key = (tp, allowed)
        if key not in self._usable_cache:
            lack = self.has_degree(tp)
            usable = self._valid & (lack[None, :] == lack[:, None])
            if allowed is not None:
                barred = np.concatenate([[0.0], np.cumsum([0.0 if tp in a else 1.0 for a in allowed])])
                usable &= barred[None, :] == barred[:, None]
            self._usable_cache[key] = usable
        return self._usable_cache[key]

    def _time(self, replicas: tuple, option: Option, link: Link | None, usable: np.ndarray, key: tuple) -> np.ndarray:
        """Per range, the slowest replica's seconds per micro-batch (inf where unusable)."""
        if key not in self._time_cache:
            times = [self.prefix(d.type.name, c, option, link) for d, c in replicas]
            prefix = np.maximum.reduce(times) if len(times) > 1 else times[0]
            self._time_cache[key] = np.where(usable, prefix[None, :] - prefix[:, None], np.inf)
        return self._time_cache[key]

    def _stage_matrix(self, slot, link, m, held, pipelines, zero, allowed, recompute_cap):
        options: list[Option] = []
        costs: list[np.ndarray] = []
        plain: list[np.ndarray] = []
        short = False
        for tp in slot.degrees():
            usable = self._usable(tp, allowed)
            if not usable.any():
                continue
            shares = slot.replica_shares(tp)
            counts = split_micro_batch(m, shares)
            replicas = tuple((slot.devices[r * tp], c) for r, c in enumerate(counts) if c > 0)
            # replicas of one type with one count cost the same: price each kind once
            seen: dict[tuple[str, int], tuple] = {}
            for d, c in replicas:
                seen.setdefault((d.type.name, c), (d, c))
            replicas = tuple(seen.values())
            kinds = tuple(seen)
            holders = pipelines - 1 + len(shares)  # a lower bound on each block's holders
            shared, zh = holders > 1, holders if zero and holders > 1 else 1
            for recompute in self.recompute:
                if recompute != "none" and (recompute_cap is None or not short):
                    break  # recomputation is never faster: only where a range does not fit without it
                option = (tp, recompute)
                key = (kinds, option, None if link is None or tp == 1 else (link.bandwidth, link.latency), allowed)
                time = self._time(replicas, option, link, usable, key)
                fit = self.fits(replicas[0][0], replicas[0][1], held, option, zh, shared)
                for d, c in replicas[1:]:
                    fit = fit & self.fits(d, c, held, option, zh, shared)
                if recompute == "none":
                    plain.append(time)
                    short = short or not bool(np.all(fit | ~usable))
                else:
                    fit = fit & (time < recompute_cap)  # too slow to beat the answer without recomputation
                costs.append(np.where(fit, time, np.inf))
                options.append(option)
        n = self.tables.n
        if not costs:
            empty = np.full((n + 1, n + 1), np.inf)
            return empty, np.zeros((n + 1, n + 1), dtype=np.int64), [_BASE], empty, False
        stacked = np.stack(costs)
        pick = np.argmin(stacked, axis=0)  # the first of equals: lower degree, no recomputation first
        best = np.take_along_axis(stacked, pick[None], axis=0)[0]
        free = np.min(np.stack(plain), axis=0) if len(plain) > 1 else plain[0]
        return best, pick, options, free, short


def slot_times(tables: CostTables, slot: Slot, m: int) -> np.ndarray:
    """Prefix array of the slot's per-micro-batch time at degree 1: the slowest replica on its share."""
    counts = split_micro_batch(m, slot.shares)
    prefixes = [tables.prefix(d.type.name, c) for d, c in zip(slot.devices, counts, strict=True) if c > 0]
    return np.maximum.reduce(prefixes) if len(prefixes) > 1 else prefixes[0]


def default_tp_link(tables: CostTables):
    """A slot's TP link: the link between its first and last device (one node: the node's link)."""

    def link(slot: Slot) -> Link | None:
        return tables.cluster.link(slot.devices[0], slot.devices[-1]) if len(slot.devices) > 1 else None

    return link


def _cut_times(tables: CostTables, m: int, link: Link | None) -> np.ndarray:
    """Transfer seconds of one micro-batch across a cut after block i-1, for i in 0..n."""
    out = np.zeros(tables.n + 1)
    if link is None:
        return out
    out[1:] = link.latency + tables.output_bytes * m / link.bandwidth
    return out


def _solve_cuts(matrices: list, cuts_cost: list[np.ndarray], weight: int, n: int) -> tuple[float, np.ndarray] | None:
    """The exact DP of the module docstring over per-stage cost matrices: (objective, argmins)."""
    n_stages = len(matrices)
    inf = float("inf")
    stage = [mat[0] for mat in matrices]
    idx = np.arange(n + 1)
    comm = [cuts_cost[s][:, None] for s in range(n_stages)]
    cycle = [np.maximum(stage[s], comm[s]) for s in range(n_stages)]

    def solve(cap: float | None) -> tuple[np.ndarray, np.ndarray]:
        """Min-max (cap None) or min-sum under a cap; values and argmins per stage."""
        value = np.full((n_stages + 1, n + 1), inf)
        choice = np.zeros((n_stages + 1, n + 1), dtype=np.int64)
        value[0, 0] = 0.0
        for s in range(1, n_stages + 1):
            prev = value[s - 1][:, None]
            if cap is None:
                cand = np.maximum(prev, cycle[s - 1])
            else:
                cand = np.where(cycle[s - 1] <= cap, prev + stage[s - 1] + comm[s - 1], inf)
            k = np.argmin(cand, axis=0)  # first minimum: deterministic
            choice[s] = k
            value[s] = cand[k, idx]
        return value, choice

    value, _ = solve(None)
    bottleneck = value[n_stages, n]
    if not np.isfinite(bottleneck):
        return None
    value, choice = solve(bottleneck * (1 + 1e-12) + 1e-15)
    best_total = value[n_stages, n]
    best_objective, best_choice = weight * bottleneck + best_total, choice
    if weight < _NO_PRUNE_LIMIT:
        floor_value, _ = solve(inf)  # the smallest total with no cap: a bound on every total
        floor = floor_value[n_stages, n]
        caps = np.unique(np.concatenate([c[np.isfinite(c)] for c in cycle]))
        for cap in caps[caps > bottleneck * (1 + 1e-12)]:
            if weight * cap + floor >= best_objective:
                break
            value, choice = solve(cap * (1 + 1e-12))
            total = value[n_stages, n]
            if weight * cap + total < best_objective * (1 - 1e-12):
                best_objective, best_choice = weight * cap + total, choice
    return float(best_objective), best_choice


def partition(
    tables: CostTables,
    slots: list[Slot],
    *,
    m: int,
    n_micro: int,
    schedule: str,
    links: list[Link],
    objective_micro: int | None = None,
    costs: SlotCosts | None = None,
    pipelines: int = 1,
    zero: bool = False,
    allowed: tuple[frozenset[int], ...] | None = None,
) -> Partition | None:
    """The best contiguous split of all blocks over ``slots`` (in that order), or None if none fits.

    ``links[s]`` is the link between slot ``s`` and slot ``s + 1``; ``n_micro`` sets how many
    micro-batches a stage holds (memory), ``objective_micro`` how many the time objective counts
    (default ``n_micro``). ``costs`` carries the option matrices (made here when absent, with TP
    groups all-reducing over their node's link); ``pipelines``: how many pipelines the structure
    has, each holding every block once (by this slot's replicas in this one: a lower bound on the
    holders, so the check stays conservative), which sets whether gradients pass through all-reduce
    buckets and, with ``zero``, what ZeRO-1 shards the optimizer state over; ``allowed`` restricts
    each block's TP degree.
    """
    n, n_stages = tables.n, len(slots)
    if n_stages > n:
        return None
    if costs is None:
        costs = SlotCosts(tables, default_tp_link(tables))
    inf = float("inf")
    cuts_cost = [np.zeros(n + 1)] + [_cut_times(tables, m, link) for link in links]
    weight = max((objective_micro if objective_micro is not None else n_micro) - 1, 0)
    held = [in_flight(schedule, i, n_stages, n_micro) for i in range(n_stages)]

    def matrices_for(cap: float | None) -> list:
        return [
            costs.stage_matrix(s, m, held[i], pipelines=pipelines, zero=zero, allowed=allowed, recompute_cap=cap)
            for i, s in enumerate(slots)
        ]

    # without recomputation first; then, where some range did not fit, again with it, pricing only
    # ranges fast enough to beat that first answer (a stage of time t adds at least (M - 1 + 1) t)
    matrices = matrices_for(None)
    found = _solve_cuts(matrices, cuts_cost, weight, n)
    if any(mat[4] for mat in matrices):
        bound = found[0] if found is not None else inf
        again = matrices_for(bound / (weight + 1))
        better = _solve_cuts(again, cuts_cost, weight, n)
        if better is not None and (found is None or better[0] < found[0] * (1 - 1e-12)):
            matrices, found = again, better
    if found is None:
        return None
    _, best_choice = found
    stage = [mat[0] for mat in matrices]
    choice = best_choice
    cuts = [n]
    for s in range(n_stages, 0, -1):
        cuts.append(int(choice[s, cuts[-1]]))
    cuts.reverse()
    ranges = [(cuts[s], cuts[s + 1]) for s in range(n_stages)]
    stage_times = tuple(float(stage[s][i, j]) for s, (i, j) in enumerate(ranges))
    options = tuple(matrices[s][2][int(matrices[s][1][i, j])] for s, (i, j) in enumerate(ranges))
    memory_bound = any(matrices[s][3][i, j] < stage_times[s] * (1 - 1e-12) for s, (i, j) in enumerate(ranges))
    comm_times = tuple(float(cuts_cost[s][cuts[s]]) for s in range(1, n_stages))
    return Partition(
        cuts=tuple(cuts),
        stage_times=stage_times,
        comm_times=comm_times,
        bottleneck=max(max(stage_times), max(comm_times, default=0.0)),
        total=sum(stage_times) + sum(comm_times),
        options=options if any(o != _BASE for o in options) else (),
        memory_bound=memory_bound,
        replicated=any(len(slot.devices) > t for slot, (t, _) in zip(slots, options, strict=True)),
    )

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

import functools
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hetplan.contracts.cluster import Device, Link
from hetplan.contracts.plan import RECOMPUTE, split_micro_batch
from hetplan.simulate.costs import block_costs
from hetplan.solve.range_memory import RangeBase, RangeTerms, range_base
from hetplan.solve.tables import CostTables

__all__ = [
    "Option",
    "Partition",
    "Slot",
    "SlotCosts",
    "StageCost",
    "default_tp_link",
    "floor_terms",
    "in_flight",
    "partition",
    "pipeline_floor",
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

    @cached_property
    def one_group(self) -> bool:
        """All devices one type on one node: they may form tensor-parallel groups (computed once:
        the search asks each slot many times)."""
        return len({(d.node, d.type.name) for d in self.devices}) == 1

    def degrees(self) -> tuple[int, ...]:
        """Tensor-parallel degrees the slot's devices can form (before asking the profile)."""
        return self._degrees

    @cached_property
    def _degrees(self) -> tuple[int, ...]:
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


@dataclass(frozen=True)
class StageCost:
    """One slot's per-range costs at one micro-batch size, micro-batches held, ZeRO setting and
    allowed degrees, independent of the recomputation cap (so one object serves both DP passes).

    ``fast`` is the fastest option without recomputation that fits (inf: none fits), ``slow`` the
    fastest recomputation option that fits (None where none was priced: recomputation is priced
    only once some degree's plain option leaves a usable range unfitted). The DP needs only these
    two matrices; which option won, and the fastest time ignoring memory, are asked afterwards for
    the few ranges the DP chose (:meth:`option_at`, :meth:`free_at`), from the per-option time and
    fit matrices kept in preference order (lower degree first; no recomputation, then full, then
    selective), exactly what an argmin over every option's matrix would have picked.
    """

    options: tuple[Option, ...]
    times: tuple[np.ndarray, ...]  # per option: seconds per micro-batch of the slowest replica (inf: unusable)
    fits: tuple[np.ndarray, ...]  # per option: every replica holds the range
    fast: np.ndarray
    slow: np.ndarray | None
    short: bool  # some usable range did not fit without recomputation

    def best(self, cap: float | None) -> np.ndarray:
        """Per range, the fastest fitting option, recomputation counted only below ``cap`` (none
        without a cap). The fastest recomputation below the cap is ``slow`` where ``slow < cap``:
        every other fitting recomputation is at least ``slow``, so the cap removes them all or
        keeps the fastest."""
        if cap is None or self.slow is None:
            return self.fast
        return np.minimum(self.fast, np.where(self.slow < cap, self.slow, np.inf))

    def option_at(self, i: int, j: int, cap: float | None, value: float) -> Option:
        """The first option (in preference order) whose cost on ``[i, j)`` is ``value``."""
        for option, time, fit in zip(self.options, self.times, self.fits, strict=True):
            recomputes = option[1] != "none"
            if recomputes and cap is None:
                continue
            cost = float(time[i, j]) if fit[i, j] else float("inf")
            if recomputes and not cost < cap:
                cost = float("inf")
            if cost == value:
                return option
        return self.options[0] if self.options else _BASE

    def free_at(self, i: int, j: int) -> float:
        """The fastest option without recomputation on ``[i, j)``, ignoring memory."""
        return min(
            (float(t[i, j]) for o, t in zip(self.options, self.times, strict=True) if o[1] == "none"),
            default=float("inf"),
        )


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
        self._fit_all: dict[tuple, np.ndarray] = {}
        self._floors: dict[tuple, np.ndarray] = {}
        self._interned_fits: dict[bytes, np.ndarray] = {}
        self._by_content: dict[tuple, StageCost] = {}
        self._everywhere: dict[tuple[int, int], bool] = {}
        self.partitions: dict[tuple, Partition | None] = {}  # by content: see partition()
        self._kinds: dict[int, tuple[Slot, tuple, Link | None]] = {}
        self._layouts: dict[tuple, list[tuple]] = {}
        self._terms: dict[tuple, RangeTerms] = {}
        self._bases: dict[Option, RangeBase] = {}
        self._matrices: dict[tuple, StageCost] = {}
        self._usable_cache: dict[tuple, np.ndarray] = {}
        self._time_cache: dict[tuple, np.ndarray] = {}
        self._has: dict[tuple[int, tuple[str, ...]], np.ndarray] = {}
        self.recompute = RECOMPUTE

    def has_degree(self, tp: int, types: tuple[str, ...] = ()) -> np.ndarray:
        """Prefix counts of blocks lacking degree ``tp`` (a range has it where the count is unchanged);
        with ``types``, lacking it for any of those device types (a profile may time a degree on
        some types only: Sailor's OPT-350 has degree 8 on the V100, not on the A100)."""
        key = (tp, types)
        if key not in self._has:
            lack = [
                0.0 if all(tp in self.tables.tp_options(b, b + 1, t) for t in types or (None,)) else 1.0
                for b in range(self.tables.n)
            ]
            self._has[key] = np.concatenate([[0.0], np.cumsum(lack)])
        return self._has[key]

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
                if option not in self._bases:
                    self._bases[option] = range_base(
                        self.tables.profile, optimizer=self.tables.optimizer, tp=option[0], recompute=option[1]
                    )
                self._terms[tkey] = self._bases[option].terms(zero_holders)
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
    ) -> StageCost:
        """The slot's per-range costs at micro-batch ``m`` with ``held`` micro-batches in flight
        (cached; see :class:`StageCost`). The key holds what the costs depend on and no more: the
        devices' types, whether they are one group (one type on one node), their shares and the
        TP link, not which node they are on (slots on other nodes of one kind share one answer);
        ``pipelines`` only as far as it changes the holders the memory check assumes (without
        ZeRO-1, any two or more pipelines mean "shared")."""
        kind, link = self._kind(slot)
        key = (kind, m, held, pipelines if zero else min(pipelines, 2), zero, allowed)
        found = self._matrices.get(key)
        if found is None:
            found = self._matrices[key] = self._stage_matrix(slot, kind, link, m, held, pipelines, zero, allowed)
        return found

    def _kind(self, slot: Slot) -> tuple[tuple, Link | None]:
        """What a slot's costs depend on (its devices' types, whether they are one group, their
        shares, the TP link), and that link; cached per slot object."""
        same = self._kinds.get(id(slot))
        if same is None or same[0] is not slot:
            link = self.tp_link(slot)
            kind = (
                tuple(d.type.name for d in slot.devices),
                slot.one_group,
                slot.shares,
                None if link is None else (link.bandwidth, link.latency),
            )
            same = self._kinds[id(slot)] = (slot, kind, link)
        return same[1], same[2]

    def _layout(
        self, slot: Slot, kind: tuple, link: Link | None, m: int, allowed: tuple[frozenset[int], ...] | None
    ) -> list[tuple]:
        """Per degree with a usable range, what every stage cost of this kind, size and map
        shares: (degree, usable ranges, replica kinds as (device, samples), their (type,
        samples) key, replica count, the time matrix of each recomputation, made when asked)."""
        key = (kind, m, allowed)
        found = self._layouts.get(key)
        if found is None:
            found = []
            types = tuple(sorted({d.type.name for d in slot.devices}))
            for tp in slot.degrees():
                usable = self._usable(tp, allowed, types if tp > 1 else ())
                if not usable.any():
                    continue
                replicas, kinds, shares = self._replicas(slot, m, tp)
                link_key = None if link is None or tp == 1 else (link.bandwidth, link.latency)

                def time(
                    recompute: str,
                    tp: int = tp,
                    usable: np.ndarray = usable,
                    replicas: tuple = replicas,
                    kinds: tuple = kinds,
                    link_key: tuple[float, float] | None = link_key,
                ) -> np.ndarray:
                    option = (tp, recompute)
                    return self._time(replicas, option, link, usable, (kinds, option, link_key, allowed))

                found.append((tp, usable, replicas, kinds, len(shares), time))
            self._layouts[key] = found
        return found

    def _usable(self, tp: int, allowed: tuple[frozenset[int], ...] | None, types: tuple[str, ...] = ()) -> np.ndarray:
        """Ranges whose every block has degree ``tp`` (with times for each of ``types``) and may take
        it under ``allowed``."""
        key = (tp, allowed, types)
        if key not in self._usable_cache:
            lack = self.has_degree(tp, types)
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

    def _fit(self, replicas: tuple, held: int, option: Option, zh: int, shared: bool, kinds: tuple) -> np.ndarray:
        """Per range: every replica kind holds it (cached by the kinds, as the time matrices)."""
        key = (kinds, held, option, zh, shared)
        found = self._fit_all.get(key)
        if found is None:
            found = self.fits(replicas[0][0], replicas[0][1], held, option, zh, shared)
            for d, c in replicas[1:]:
                found = found & self.fits(d, c, held, option, zh, shared)
            # interned by content: micro-batches held, holders and ZeRO that change no range's fit
            # give one array, so the stage costs and partitions built on it are shared too
            found = self._fit_all[key] = self._interned_fits.setdefault(found.tobytes(), found)
        return found

    def _replicas(self, slot: Slot, m: int, tp: int) -> tuple[tuple, tuple, tuple[float, ...]]:
        """The replicas of one micro-batch of ``m`` at degree ``tp`` as (device, samples), one per
        kind (replicas of one type with one count cost the same), their kinds, and the shares."""
        shares = slot.replica_shares(tp)
        counts = split_micro_batch(m, shares)
        seen: dict[tuple[str, int], tuple] = {}
        for r, c in enumerate(counts):
            if c > 0:
                d = slot.devices[r * tp]
                seen.setdefault((d.type.name, c), (d, c))
        return tuple(seen.values()), tuple(seen), shares

    def floor_matrix(
        self, slot: Slot, m: int, holders: int, allowed: tuple[frozenset[int], ...] | None = None
    ) -> np.ndarray:
        """Per range, the fastest option (any degree the blocks have, any recomputation) that fits
        one device under the most lenient memory any stage of the slot can face: one micro-batch
        in flight, nothing all-reduced, the optimizer state sharded over ``holders`` (ZeRO-1 over
        at most every device). A stage's memory only grows with more micro-batches in flight,
        with all-reduce buckets and with fewer holders, so whatever option a real stage of the
        slot takes fits here too, and no stage is faster than this (inf where nothing fits). With
        ``allowed``, only the degrees it gives each block, as :meth:`stage_matrix`."""
        kind, link = self._kind(slot)
        key = (kind, m, holders, allowed)
        found = self._floors.get(key)
        if found is None:
            for _tp, _usable, replicas, kinds, _n, time in self._layout(slot, kind, link, m, allowed):
                for recompute in self.recompute:
                    option = (_tp, recompute)
                    fit = self._fit(replicas, 1, option, holders, False, kinds)
                    cost = np.where(fit, time(recompute), np.inf)
                    found = cost if found is None else np.minimum(found, cost)
            if found is None:
                found = np.full((self.tables.n + 1, self.tables.n + 1), np.inf)
            self._floors[key] = found
        return found

    def _stage_matrix(
        self,
        slot: Slot,
        kind: tuple,
        link: Link | None,
        m: int,
        held: int,
        pipelines: int,
        zero: bool,
        allowed: tuple[frozenset[int], ...] | None,
    ) -> StageCost:
        """The :class:`StageCost` of :meth:`stage_matrix` (options in preference order, plain
        before recomputation, which is priced only from the first degree that leaves a usable
        range unfitted), shared with every key whose fit matrices are the same."""
        options: list[Option] = []
        times: list[np.ndarray] = []
        fits: list[np.ndarray] = []
        short = False
        for tp, usable, replicas, kinds, n_replicas, time in self._layout(slot, kind, link, m, allowed):
            holders = pipelines - 1 + n_replicas  # a lower bound on each block's holders
            shared, zh = holders > 1, holders if zero and holders > 1 else 1
            for recompute in self.recompute:
                if recompute != "none" and not short:
                    break  # recomputation is never faster: only where a range does not fit without it
                option = (tp, recompute)
                fit = self._fit(replicas, held, option, zh, shared, kinds)
                if recompute == "none":
                    short = short or not self._fits_everywhere(fit, usable)
                times.append(time(recompute))
                fits.append(fit)
                options.append(option)
        # what the costs are made of: the slot's kind, size and map (which fix every option's
        # time) and each option's fit matrix (interned, so its id stands for its content)
        content = (kind, m, allowed, tuple((option, id(fit)) for option, fit in zip(options, fits, strict=True)))
        found = self._by_content.get(content)
        if found is None:
            fast: np.ndarray | None = None  # fastest fitting option without recomputation, per range
            slow: np.ndarray | None = None  # fastest fitting recomputation, per range
            for option, time, fit in zip(options, times, fits, strict=True):
                cost = np.where(fit, time, np.inf)
                if option[1] == "none":
                    fast = cost if fast is None else np.minimum(fast, cost)
                else:
                    slow = cost if slow is None else np.minimum(slow, cost)
            if fast is None:
                n = self.tables.n
                fast = np.full((n + 1, n + 1), np.inf)
            found = self._by_content[content] = StageCost(tuple(options), tuple(times), tuple(fits), fast, slow, short)
        return found

    def _fits_everywhere(self, fit: np.ndarray, usable: np.ndarray) -> bool:
        """Every usable range fits (cached: both arrays are shared objects)."""
        key = (id(fit), id(usable))
        found = self._everywhere.get(key)
        if found is None:
            found = self._everywhere[key] = bool(np.all(fit | ~usable))
        return found


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


class _Passes:
    """The DP's passes over one pipeline's stage matrices, each on its reachable block.

    Stage ``s`` of ``S`` can only start at a cut in ``[s, n - S + s]`` and end at one in
    ``[s + 1, n - S + s + 1]`` (every stage holds a block), so each pass works on that block of
    its matrix (the first stage on row 0, the last on column n); every other entry is unreachable
    (infinite) and could not change a minimum.
    """

    def __init__(self, stage: list[np.ndarray], cuts_cost: list[np.ndarray], n: int) -> None:
        n_stages = len(stage)
        span = n - n_stages + 1
        self.n_stages = n_stages
        self.rows = [(0, 1) if s == 0 else (s, s + span) for s in range(n_stages)]
        self.cols = [(n, n + 1) if s == n_stages - 1 else (s + 1, s + 1 + span) for s in range(n_stages)]
        self.sub = [
            stage[s][r0:r1, c0:c1] for s, ((r0, r1), (c0, c1)) in enumerate(zip(self.rows, self.cols, strict=True))
        ]
        self.out = [cuts_cost[s][r0:r1] for s, (r0, r1) in enumerate(self.rows)]  # cut times at each start
        self.comm = [o[:, None] for o in self.out]
        self.cycle = [np.maximum(self.sub[s], self.comm[s]) for s in range(n_stages)]
        self.first = np.zeros(1)  # the value at cut 0; every other start of the first stage is unreachable

    def min_max(self) -> float:
        """The smallest bottleneck (slowest stage or cut) of any split."""
        value = self.first
        for cycle in self.cycle:
            value = _column_min(np.maximum(value[:, None], cycle))
        return value[-1]

    def min_sum(self, cap: float) -> list[np.ndarray]:
        """Per stage count, the smallest total reaching each cut with every cycle at most ``cap``
        (``(value + stage) + cut``, the order the DP always added them; inf where a cycle is over
        the cap: ``cycle > cap`` is ``not cycle <= cap``, no entry being NaN)."""
        values = [self.first]
        unbounded = cap == float("inf")
        for sub, comm, cycle in zip(self.sub, self.comm, self.cycle, strict=True):
            cand = values[-1][:, None] + sub
            cand += comm
            if not unbounded:  # an infinite cap keeps every entry (an infinite cycle's sum is infinite)
                np.copyto(cand, np.inf, where=cycle > cap)
            values.append(_column_min(cand))
        return values


_column_min = functools.partial(np.minimum.reduce, axis=0)


def floor_terms(stage: list[np.ndarray], cuts_cost: list[np.ndarray], n: int) -> tuple[float, float] | None:
    """(smallest bottleneck, smallest total) over every split of the blocks with these per-stage
    matrices, or None where no split is finite: with :meth:`SlotCosts.floor_matrix` no partition at
    this micro-batch size has a smaller bottleneck or total, whatever its micro-batch count,
    memory, ZeRO setting or allowed degrees (the search's bound on a structure's estimate)."""
    if len(stage) > n:
        return None
    passes = _Passes(stage, cuts_cost, n)
    bottleneck = passes.min_max()
    if not np.isfinite(bottleneck):
        return None
    return float(bottleneck), float(passes.min_sum(float("inf"))[len(stage)][-1])


def _solve_cuts(
    stage: list[np.ndarray], cuts_cost: list[np.ndarray], weight: int, n: int
) -> tuple[float, list[int]] | None:
    """The exact DP of the module docstring over per-stage cost matrices: (objective, cuts).

    Each pass works on the reachable block of each stage's matrix (:class:`_Passes`). Only the
    values are carried through the stages (a column minimum); the cuts are recovered at the end
    by backtracking through the winning pass, one column per stage, with the same arithmetic and
    the same first-minimum rule an argmin over each whole matrix would use. The candidate caps are
    every distinct cycle of the whole matrices (as they always were), so the scan visits the same
    caps.
    """
    n_stages = len(stage)
    inf = float("inf")
    if n - n_stages + 1 < 1:
        return None
    passes = _Passes(stage, cuts_cost, n)
    min_max, min_sum = passes.min_max, passes.min_sum
    rows, cols, sub, out, cycle = passes.rows, passes.cols, passes.sub, passes.out, passes.cycle

    bottleneck = min_max()
    if not np.isfinite(bottleneck):
        return None
    best_cap = bottleneck * (1 + 1e-12) + 1e-15
    best_values = min_sum(best_cap)
    best_objective = weight * bottleneck + best_values[n_stages][-1]
    if weight < _NO_PRUNE_LIMIT:
        floor = min_sum(inf)[n_stages][-1]  # the smallest total with no cap: a bound on every total
        # A cap can replace the answer only if weight x cap + total < best x (1 - 1e-12), and every
        # total is at least the floor: once weight x cap + floor reaches that (caps ascend, the best
        # only falls) no later cap can, so the scan stops there; caps past it are not even listed.
        low, target = bottleneck * (1 + 1e-12), best_objective * (1 - 1e-12)
        listed = []
        for s in range(n_stages):
            whole = np.maximum(stage[s], cuts_cost[s][:, None])
            if weight:
                listed.append(whole[(whole > low) & (weight * whole + floor < target)])
            elif floor < target:  # weight 0: the test is the same for every cap (but infinite ones)
                listed.append(whole[(whole > low) & np.isfinite(whole)])
        caps = np.unique(np.concatenate(listed)) if listed else np.zeros(0)  # finite caps only
        solved: dict[int, list[np.ndarray]] = {}

        def total_at(k: int) -> float:
            if k not in solved:
                solved[k] = min_sum(caps[k] * (1 + 1e-12))
            return solved[k][n_stages][-1]

        if weight == 0:
            # one micro-batch: the objective is the total alone, which never grows with the cap, so
            # each cap the ascending scan would take (the first whose total is below best x (1 -
            # 1e-12)) is found by bisection instead of a DP per cap
            k = 0
            while k < len(caps) and floor < best_objective * (1 - 1e-12):
                target = best_objective * (1 - 1e-12)
                lo, hi = k, len(caps)
                while lo < hi:
                    mid = (lo + hi) // 2
                    if total_at(mid) < target:
                        hi = mid
                    else:
                        lo = mid + 1
                if lo == len(caps):
                    break
                best_objective, best_cap, best_values = 0 * caps[lo] + total_at(lo), caps[lo] * (1 + 1e-12), solved[lo]
                k = lo + 1
        else:
            for k, cap in enumerate(caps):
                if weight * cap + floor >= best_objective * (1 - 1e-12):
                    break
                total = total_at(k)
                if weight * cap + total < best_objective * (1 - 1e-12):
                    best_objective, best_cap, best_values = weight * cap + total, cap * (1 + 1e-12), solved[k]
    cuts = [n]
    for s in range(n_stages - 1, -1, -1):
        j = cuts[-1] - cols[s][0]
        column = np.where(cycle[s][:, j] <= best_cap, best_values[s] + sub[s][:, j] + out[s], inf)
        cuts.append(rows[s][0] + int(np.argmin(column)))  # first minimum: deterministic
    cuts.reverse()
    return float(best_objective), cuts


def pipeline_floor(
    tables: CostTables,
    slots: list[Slot],
    *,
    m: int,
    links: list[Link],
    costs: SlotCosts,
    holders: int,
    allowed: tuple[frozenset[int], ...] | None = None,
) -> tuple[float, float] | None:
    """(smallest bottleneck, smallest total) of any partition of the blocks over ``slots`` at
    micro-batch ``m`` (:func:`floor_terms` over :meth:`SlotCosts.floor_matrix`, ZeRO-1 over at most
    ``holders`` devices), or None where no split fits even so. :func:`partition` never returns one
    with a smaller bottleneck or total, whatever its micro-batch count, pipelines, ZeRO setting or
    allowed degrees (but for the order in which it adds the stages: see the search's slack)."""
    n = tables.n
    if len(slots) > n:
        return None
    stage = [costs.floor_matrix(s, m, holders, allowed) for s in slots]
    cuts_cost = [np.zeros(n + 1)] + [_cut_times(tables, m, link) for link in links]
    return floor_terms(stage, cuts_cost, n)


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
    cuts_cost = [np.zeros(n + 1)] + [_cut_times(tables, m, link) for link in links]
    weight = max((objective_micro if objective_micro is not None else n_micro) - 1, 0)
    held = [in_flight(schedule, i, n_stages, n_micro) for i in range(n_stages)]

    stage_costs = [
        costs.stage_matrix(s, m, held[i], pipelines=pipelines, zero=zero, allowed=allowed) for i, s in enumerate(slots)
    ]
    # the answer is a function of the stage costs (interned: their ids stand for their content),
    # the cut times (micro-batch size, links), the weight and the slots' widths: micro-batch
    # counts, pipeline counts and ZeRO settings that change no stage cost share it
    key = (
        tuple(id(c) for c in stage_costs),
        m,
        tuple((link.bandwidth, link.latency) for link in links),
        weight,
        tuple(len(s.devices) for s in slots),
    )
    if key not in costs.partitions:
        costs.partitions[key] = _partition(slots, stage_costs, cuts_cost, weight, n)
    return costs.partitions[key]


def _partition(
    slots: list[Slot], stage_costs: list[StageCost], cuts_cost: list[np.ndarray], weight: int, n: int
) -> Partition | None:
    """:func:`partition` from the stage costs on."""
    n_stages = len(slots)
    inf = float("inf")
    # without recomputation first; then, where some range did not fit, again with it, pricing only
    # ranges fast enough to beat that first answer (a stage of time t adds at least (M - 1 + 1) t)
    cap: float | None = None
    stage = [c.fast for c in stage_costs]
    found = _solve_cuts(stage, cuts_cost, weight, n)
    if any(c.short for c in stage_costs):
        bound = found[0] if found is not None else inf
        again_cap = bound / (weight + 1)
        again = [c.best(again_cap) for c in stage_costs]
        better = _solve_cuts(again, cuts_cost, weight, n)
        if better is not None and (found is None or better[0] < found[0] * (1 - 1e-12)):
            stage, found, cap = again, better, again_cap
    if found is None:
        return None
    _, cuts = found
    ranges = [(cuts[s], cuts[s + 1]) for s in range(n_stages)]
    stage_times = tuple(float(stage[s][i, j]) for s, (i, j) in enumerate(ranges))
    options = tuple(stage_costs[s].option_at(i, j, cap, stage_times[s]) for s, (i, j) in enumerate(ranges))
    memory_bound = any(stage_costs[s].free_at(i, j) < stage_times[s] * (1 - 1e-12) for s, (i, j) in enumerate(ranges))
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

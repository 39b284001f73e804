"""Exact partition of a block sequence over an ordered list of (possibly replicated) stages.

    slots = [Slot.of([a100]), Slot.of([v100, v100])]      # stage order fixed by the caller
    best = partition(tables, slots, m=4, n_micro=16, schedule="1f1b", links=[link01])
    best.cuts            # [0, 31, 50]: stage s runs blocks [cuts[s], cuts[s+1])
    best.bottleneck      # the slowest per-micro-batch cycle (a stage, or a cut's transfer)

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
from hetplan.contracts.plan import split_micro_batch
from hetplan.solve.tables import CostTables

__all__ = ["Partition", "Slot", "in_flight", "partition", "slot_fits", "slot_times"]

# From this many micro-batches on, the min-max solution (with the smallest total among those) is
# kept as is: the cap enumeration costs a DP per candidate cap and, with the bottleneck weighted this
# heavily, almost never finds better; below it the objective is minimised exactly.
_NO_PRUNE_LIMIT = 8


@dataclass(frozen=True)
class Slot:
    """The devices of one stage and each one's share of every micro-batch."""

    devices: tuple[Device, ...]
    shares: tuple[float, ...]

    @staticmethod
    def of(devices: list[Device] | tuple[Device, ...], shares: tuple[float, ...] | None = None) -> Slot:
        devices = tuple(devices)
        return Slot(devices, shares or tuple(1.0 / len(devices) for _ in devices))


@dataclass(frozen=True)
class Partition:
    cuts: tuple[int, ...]
    stage_times: tuple[float, ...]  # fwd + bwd per micro-batch
    comm_times: tuple[float, ...]  # per cut, one direction, per micro-batch
    bottleneck: float
    total: float

    def estimate(self, n_micro: int) -> float:
        """Closed-form pipeline time (pruning only; the simulator is the truth)."""
        return (n_micro - 1) * self.bottleneck + self.total


def in_flight(schedule: str, stage: int, n_stages: int, n_micro: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at its peak."""
    return n_micro if schedule == "gpipe" else min(n_stages - stage, n_micro)


def slot_times(tables: CostTables, slot: Slot, m: int) -> np.ndarray:
    """Prefix array of the slot's per-micro-batch time: the slowest replica on its share."""
    counts = split_micro_batch(m, slot.shares)
    prefixes = [tables.prefix(d.type.name, c) for d, c in zip(slot.devices, counts, strict=True) if c > 0]
    return np.maximum.reduce(prefixes) if len(prefixes) > 1 else prefixes[0]


def slot_fits(tables: CostTables, slot: Slot, m: int, held: int) -> np.ndarray:
    """``fits[i, j]``: can the slot hold blocks ``[i, j)``? (an (n+1) x (n+1) boolean matrix)."""
    counts = split_micro_batch(m, slot.shares)
    n = tables.n
    ok = np.ones((n + 1, n + 1), dtype=bool)
    static = (tables.param_bytes[None, :] - tables.param_bytes[:, None]) + tables.state_per_param * (
        tables.params[None, :] - tables.params[:, None]
    )
    # per sample held from a forward to its backward: saved activations plus the stage's output
    act = tables.activation[None, :] - tables.activation[:, None] + tables.held_output[None, :]
    for d, c in zip(slot.devices, counts, strict=True):
        need = static + act * c * held
        ok &= need <= d.type.usable_tensor_bytes
    return ok


def _cut_times(tables: CostTables, m: int, link: Link | None) -> np.ndarray:
    """Transfer seconds of one micro-batch across a cut after block i-1, for i in 0..n."""
    out = np.zeros(tables.n + 1)
    if link is None:
        return out
    out[1:] = link.latency + tables.output_bytes * m / link.bandwidth
    return out


def partition(
    tables: CostTables,
    slots: list[Slot],
    *,
    m: int,
    n_micro: int,
    schedule: str,
    links: list[Link],
    objective_micro: int | None = None,
) -> Partition | None:
    """The best contiguous split of all blocks over ``slots`` (in that order), or None if none fits.

    ``links[s]`` is the link between slot ``s`` and slot ``s + 1``; ``n_micro`` sets how many
    micro-batches a stage holds (memory), ``objective_micro`` how many the time objective counts
    (default ``n_micro``).
    """
    n, n_stages = tables.n, len(slots)
    if n_stages > n:
        return None
    inf = float("inf")
    times = [slot_times(tables, s, m) for s in slots]
    fits = [slot_fits(tables, s, m, in_flight(schedule, i, n_stages, n_micro)) for i, s in enumerate(slots)]
    cuts_cost = [np.zeros(n + 1)] + [_cut_times(tables, m, link) for link in links]

    # stage[s][i, j]: per-micro-batch time of slot s on blocks [i, j); cycle adds the incoming cut
    idx = np.arange(n + 1)
    valid = idx[:, None] < idx[None, :]
    stage = [np.where(valid & fits[s], times[s][None, :] - times[s][:, None], inf) for s in range(n_stages)]
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
    weight = max((objective_micro if objective_micro is not None else n_micro) - 1, 0)
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
    choice = best_choice
    cuts = [n]
    for s in range(n_stages, 0, -1):
        cuts.append(int(choice[s, cuts[-1]]))
    cuts.reverse()
    stage_times = tuple(float(times[s][cuts[s + 1]] - times[s][cuts[s]]) for s in range(n_stages))
    comm_times = tuple(float(cuts_cost[s][cuts[s]]) for s in range(1, n_stages))
    return Partition(
        cuts=tuple(cuts),
        stage_times=stage_times,
        comm_times=comm_times,
        bottleneck=max(max(stage_times), max(comm_times, default=0.0)),
        total=sum(stage_times) + sum(comm_times),
    )

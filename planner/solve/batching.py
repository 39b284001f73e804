"""Batch shares across pipelines and micro-batch lists inside each (Stannis, AutoPipe-H).

shares = allocate_batch(512, [lambda b: t0(b), lambda b: t1(b)])   # samples per pipeline
micro_batch_list(100, 8)          # (4, 8, 8, ..., 8): the remainder first, as a smaller micro-batch
startup_splits((8, 8, 8, 8))      # (4, 4, 8, 8, 8), (2, 2, 4, 8, 8, 8), ...: smaller first micro-batches
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["TimeTable", "allocate_batch", "micro_batch_list", "startup_splits", "water_fill"]


class TimeTable:
    """A pipeline's time for ``b`` samples as one array, ``values[b]``, also callable as ``t(b)``:
    :func:`allocate_batch` water-fills tables with numpy instead of one heap step per sample."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def __call__(self, b: int) -> float:
        return float(self.values[b])


def micro_batch_list(batch: int, m: int) -> tuple[int, ...]:
    """``batch`` samples as micro-batches of ``m``; a remainder goes first (a smaller first
    micro-batch also shortens the pipeline fill)."""
    full, rest = divmod(batch, m)
    return ((rest,) if rest else ()) + (m,) * full


def allocate_batch(global_batch: int, times: list[Callable[[int], float]]) -> list[int]:
    """Samples per pipeline so that the slowest finishes as early as possible.

    Water-filling one sample at a time onto the pipeline whose time after taking it is smallest;
    for non-decreasing time functions this minimises the maximum (an exchange argument: any
    allocation with a smaller maximum would have to give some pipeline fewer samples than this one,
    and another more, at a cost at least the greedy step's). Every pipeline gets at least one
    sample; callers drop pipelines they cannot feed.
    """
    count = len(times)
    if global_batch < count:
        raise ValueError("fewer samples than pipelines")
    fast = _allocate_tables(global_batch, times)
    if fast is not None:
        return fast
    shares = [1] * count
    heap = [(times[p](2), p) for p in range(count)]
    heapq.heapify(heap)
    for _ in range(global_batch - count):
        _, p = heapq.heappop(heap)
        shares[p] += 1
        heapq.heappush(heap, (times[p](shares[p] + 1), p))
    return shares


def _allocate_tables(global_batch: int, times: Sequence[Callable[[int], float]]) -> list[int] | None:
    """The heap's answer without the heap, where every time is a :class:`TimeTable` (else None:
    the caller runs the heap).

    The heap pops, one sample at a time, the smallest ``(time after one more sample, pipeline)``
    among each pipeline's next step. Cut each pipeline's steps ``t(2), t(3), ...`` into runs, a
    run starting at each step above every earlier one. A run goes in one piece: when its first
    step ``(v, p)`` is popped every other head is above it, and the run's later steps are at most
    ``v``, so they are popped next. Runs start with their pipeline's running maximum, which only
    rises, so the heap merges runs in the order ``(first step, pipeline)``: each step is popped in
    the order ``(running maximum of its pipeline's steps up to it, pipeline, step)``, and after
    ``extra`` pops it has taken exactly the ``extra`` first steps in that order. Those are every
    step whose running maximum is below the ``extra``-th smallest, and of the steps at it the first
    ones by pipeline, then step.
    """
    extra = global_batch - len(times)
    if extra == 0:
        return [1] * len(times)
    # pipelines that share one table (identical pipelines) are one row, counted as often as they occur
    index: dict[int, int] = {}
    rows: list[np.ndarray] = []
    for t in times:
        if id(t) not in index:
            if not isinstance(t, TimeTable) or len(t.values) < extra + 2:
                return None
            index[id(t)] = len(rows)
            rows.append(t.values)
    which = np.array([index[id(t)] for t in times], dtype=np.int64)
    shares = water_fill(global_batch, rows, which)
    return None if shares is None else shares.tolist()


def water_fill(global_batch: int, rows: list[np.ndarray], which: np.ndarray) -> np.ndarray | None:
    """:func:`allocate_batch`'s shares (as :func:`_allocate_tables` explains) of pipelines whose
    times are ``rows[which[p]][b]`` (each row at least ``global_batch - len(which) + 2`` long), or
    None where a row holds NaN. For callers that already know which pipelines are alike."""
    extra = global_batch - len(which)
    if extra == 0:
        return np.ones(len(which), dtype=np.int64)
    steps = np.stack([row[2 : extra + 2] for row in rows])  # steps[r][k]: t(k + 2)
    if np.isnan(steps).any():  # the heap's order is not a total order with NaN
        return None
    level = np.maximum.accumulate(steps, axis=1)
    copies = np.bincount(which, minlength=len(rows))
    values = np.unique(level)
    taken = np.zeros(len(values), dtype=np.int64)  # steps at or below each value, every pipeline
    for r in range(len(rows)):
        taken += copies[r] * np.searchsorted(level[r], values, side="right")
    threshold = values[int(np.searchsorted(taken, extra, side="left"))]  # the extra-th smallest
    below = np.array([np.searchsorted(level[r], threshold, side="left") for r in range(len(rows))])
    equal = np.array([np.searchsorted(level[r], threshold, side="right") for r in range(len(rows))]) - below
    mine_below, mine_equal = below[which], equal[which]
    left = extra - int(mine_below.sum())
    # the steps at the threshold go to the pipelines in index order, each taking all of its own first
    before = np.cumsum(mine_equal) - mine_equal  # equal steps of the pipelines before this one
    take = np.clip(left - before, 0, mine_equal)
    return 1 + mine_below + take


def startup_splits(micro: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Variants with the first micro-batch split into smaller ones (AutoPipe-H's startup splitting)."""
    out = []
    first, rest = micro[0], micro[1:]
    if first >= 2:
        half = first // 2
        out.append((first - half, half, *rest))
        if first >= 4:
            quarter = first // 4
            out.append((quarter, quarter, first - 2 * quarter, *rest))
    if len(micro) >= 2 and micro[0] == micro[1] and micro[0] >= 2:
        h = micro[0] // 2
        out.append((micro[0] - h, h, micro[1] - micro[1] // 2, micro[1] // 2, *micro[2:]))
    return out

"""Batch shares across pipelines and micro-batch lists inside each (Stannis, AutoPipe-H).

shares = allocate_batch(512, [lambda b: t0(b), lambda b: t1(b)])   # samples per pipeline
micro_batch_list(100, 8)          # (4, 8, 8, ..., 8): the remainder first, as a smaller micro-batch
startup_splits((8, 8, 8, 8))      # (4, 4, 8, 8, 8), (2, 2, 4, 8, 8, 8), ...: smaller first micro-batches
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

__all__ = ["allocate_batch", "micro_batch_list", "startup_splits"]


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
    shares = [1] * count
    heap = [(times[p](2), p) for p in range(count)]
    heapq.heapify(heap)
    for _ in range(global_batch - count):
        _, p = heapq.heappop(heap)
        shares[p] += 1
        heapq.heappush(heap, (times[p](shares[p] + 1), p))
    return shares


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

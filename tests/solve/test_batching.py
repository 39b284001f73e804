"""Batch shares and micro-batch lists."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.solve.batching import allocate_batch, micro_batch_list, startup_splits


@settings(max_examples=150, deadline=None)
@given(
    rates=st.lists(st.floats(0.1, 5.0), min_size=1, max_size=4),
    fills=st.lists(st.floats(0.0, 3.0), min_size=4, max_size=4),
    m=st.integers(1, 4),
    extra=st.integers(0, 10),
)
def test_water_filling_minimises_the_slowest_pipeline(rates, fills, m, extra) -> None:
    count = len(rates)
    batch = count + extra

    def make(rate: float, fill: float):
        return lambda b: (math.ceil(b / m) - 1) * rate + fill + rate

    times = [make(r, f) for r, f in zip(rates, fills, strict=False)]
    shares = allocate_batch(batch, times)
    assert sum(shares) == batch and min(shares) >= 1
    got = max(t(b) for t, b in zip(times, shares, strict=True))
    best = min(
        max(t(b) for t, b in zip(times, split, strict=True))
        for split in itertools.product(range(1, batch + 1), repeat=count)
        if sum(split) == batch
    )
    assert got <= best + 1e-9


def test_micro_batch_list_puts_the_remainder_first() -> None:
    assert micro_batch_list(10, 4) == (2, 4, 4)
    assert micro_batch_list(8, 4) == (4, 4)
    assert micro_batch_list(3, 8) == (3,)


@settings(deadline=None, derandomize=True)
@given(micro=st.lists(st.integers(1, 16), min_size=1, max_size=6).map(tuple))
def test_startup_splits_keep_the_total_and_only_shrink_the_start(micro) -> None:
    for variant in startup_splits(micro):
        assert sum(variant) == sum(micro)
        assert len(variant) > len(micro)
        assert all(v >= 1 for v in variant)
        assert variant[0] <= micro[0]

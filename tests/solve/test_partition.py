"""The partition DP against brute force over every contiguous split."""

from __future__ import annotations

import itertools

import pytest
from builders import make_cluster, make_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.solve.partition import Slot, partition
from hetplan.solve.tables import CostTables

A100, V100, T4 = "A100-80GB", "V100-16GB", "T4"


def _brute(tables: CostTables, slots, links, m: int, micro: int):
    n = tables.n
    best = None
    for inner in itertools.combinations(range(1, n), len(slots) - 1):
        cuts = (0, *inner, n)
        stage = [tables.stage_time(s.devices[0].type.name, m, cuts[i], cuts[i + 1]) for i, s in enumerate(slots)]
        comm = [
            links[i].latency + tables.output_bytes[cuts[i + 1] - 1] * m / links[i].bandwidth
            for i in range(len(slots) - 1)
        ]
        objective = (micro - 1) * max(stage + comm) + sum(stage) + sum(comm)
        if best is None or objective < best - 1e-12:
            best = objective
    return best


@settings(max_examples=120, deadline=None)
@given(
    times=st.lists(st.tuples(st.floats(0.01, 3.0), st.floats(0.01, 3.0)), min_size=2, max_size=10),
    order=st.lists(st.sampled_from([A100, V100, T4]), min_size=1, max_size=4),
    micro=st.integers(1, 8),  # exact up to 8 micro-batches (partition._NO_PRUNE_LIMIT)
    out=st.sampled_from([0.0, 1e8, 1e9]),
)
def test_dp_matches_brute_force(times, order, micro, out) -> None:
    n = len(times)
    if len(order) > n:
        order = order[:n]
    per_block = {t: [(f * k, b * k) for f, b in times] for t, k in ((A100, 1.0), (V100, 2.0), (T4, 3.5))}
    profile = make_profile(n, per_block=per_block, output_bytes=out)
    cluster = make_cluster([(f"n{i}", [(t, 1)]) for i, t in enumerate(order)], inter="10GB/s", inter_latency="1ms")
    tables = CostTables(profile, cluster, optimizer="sgd")
    slots = [Slot.of([d]) for d in cluster.devices]
    links = [cluster.link(a.devices[0], b.devices[0]) for a, b in itertools.pairwise(slots)]
    result = partition(tables, slots, m=1, n_micro=10**9, schedule="1f1b", links=links, objective_micro=micro)
    assert result is not None
    assert result.estimate(micro) == pytest.approx(_brute(tables, slots, links, 1, micro), rel=1e-9)
    assert result.cuts[0] == 0 and result.cuts[-1] == n
    assert all(a < b for a, b in itertools.pairwise(result.cuts))


def test_memory_constraint_moves_blocks_off_a_small_device() -> None:
    # 4 blocks of 3 GB of parameters each (fp32 + grads + Adam = 16 B/param): a T4 (16 GiB) holds
    # at most one block; an A100-80GB holds them all.
    profile = make_profile(4, times={A100: (1.0, 1.0), T4: (0.1, 0.1)}, params=750_000_000)
    cluster = make_cluster([("n0", [(T4, 1), (A100, 1)])])
    tables = CostTables(profile, cluster, optimizer="adam")
    t4, a100 = cluster.devices
    result = partition(
        tables,
        [Slot.of([t4]), Slot.of([a100])],
        m=1,
        n_micro=10**9,
        schedule="1f1b",
        links=[cluster.link(t4, a100)],
        objective_micro=8,
    )
    assert result is not None and result.cuts == (0, 1, 4)  # the fast T4 would take all but cannot


def test_nothing_fits_returns_none() -> None:
    profile = make_profile(2, times={T4: (1.0, 1.0)}, params=2_000_000_000)
    cluster = make_cluster([("n0", [(T4, 2)])])
    tables = CostTables(profile, cluster, optimizer="adam")
    slots = [Slot.of([d]) for d in cluster.devices]
    assert partition(tables, slots, m=1, n_micro=10**9, schedule="1f1b", links=[cluster.link(*cluster.devices)]) is None


def test_replicated_slot_runs_at_its_slowest_share() -> None:
    profile = make_profile(2, times={A100: (1.0, 1.0), V100: (2.0, 2.0)})
    cluster = make_cluster([("n0", [(A100, 1), (V100, 1)])])
    tables = CostTables(profile, cluster, optimizer="sgd")
    a100, v100 = cluster.devices
    slot = Slot.of([a100, v100], (0.75, 0.25))
    result = partition(tables, [slot], m=4, n_micro=10**9, schedule="1f1b", links=[])
    # 3 samples on the A100 (2 blocks x 2 s x 3) vs 1 on the V100 (2 x 4 x 1): the A100 bounds it
    assert result.stage_times == (pytest.approx(12.0),)

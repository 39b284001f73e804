"""The node-pairing ILP against brute force over every assignment."""

from __future__ import annotations

import itertools

from builders import make_cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.solve.mapping import pair_nodes


def _cluster(n_left: int, n_right: int, bandwidths: list[float]):
    nodes = [(f"a{i}", [("A100-80GB", 1)]) for i in range(n_left)] + [
        (f"b{j}", [("V100-16GB", 1)]) for j in range(n_right)
    ]
    overrides = [
        {"between": [f"a{i}", f"b{j}"], "bandwidth": bandwidths[i * n_right + j]}
        for i in range(n_left)
        for j in range(n_right)
    ]
    cluster = make_cluster(nodes, inter="1GB/s", overrides=overrides)
    left = [cluster.device(f"a{i}/0") for i in range(n_left)]
    right = [cluster.device(f"b{j}/0") for j in range(n_right)]
    return cluster, left, right


def _score(cluster, left, right, pairs):
    times = [1.0 / cluster.link(left[i], right[j]).bandwidth for i, j in pairs]
    return max(times), sum(times)


def test_heavy_cuts_go_to_the_fast_links() -> None:
    # a0-b1 and a1-b0 are fast (same rack), the straight pairs slow
    cluster, left, right = _cluster(2, 2, [1e9, 100e9, 100e9, 1e9])
    assert pair_nodes(cluster, left, right) == [(0, 1), (1, 0)]


def test_equal_links_pair_in_index_order() -> None:
    cluster, left, right = _cluster(2, 3, [5e9] * 6)
    assert pair_nodes(cluster, left, right) == [(0, 0), (1, 1)]


@settings(max_examples=60, deadline=None)
@given(n_left=st.integers(1, 4), n_right=st.integers(1, 4), data=st.data())
def test_the_ilp_matches_brute_force(n_left, n_right, data) -> None:
    bandwidths = data.draw(
        st.lists(st.sampled_from([1e9, 2e9, 5e9, 10e9, 25e9]), min_size=n_left * n_right, max_size=n_left * n_right)
    )
    cluster, left, right = _cluster(n_left, n_right, bandwidths)
    pairs = pair_nodes(cluster, left, right)
    count = min(n_left, n_right)
    assert len(pairs) == count
    assert len({i for i, _ in pairs}) == count and len({j for _, j in pairs}) == count
    best = min(
        _score(cluster, left, right, list(zip(rows, cols, strict=True)))
        for rows in itertools.combinations(range(n_left), count)
        for cols in itertools.permutations(range(n_right), count)
    )
    got = _score(cluster, left, right, pairs)
    assert got[0] <= best[0] * (1 + 1e-9)  # the slowest link is as fast as it can be
    if got[0] <= best[0] * (1 + 1e-9):
        assert got[1] <= best[1] * (1 + 1e-6)  # and then the total
    assert pair_nodes(cluster, left, right) == pairs  # deterministic

"""What-if bounds: the memoised LP is the planner's LP, and every cheaper bound stays below it."""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

import numpy as np
import pytest
from builders import make_profile
from test_whatif import OPTS, _base

from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.pool import parse_pool
from hetplan.errors import HetplanError
from hetplan.solve.bounds import compute_lower_bound
from hetplan.solve.tables import CostTables
from hetplan.solve.training import plan_training
from hetplan.solve.whatif import Objective, what_if, what_if_space
from hetplan.solve.whatif_bounds import CandidateBounds

POOL = {
    "schema": "hetplan/pool/v1",
    "nodes": [
        {"name": "a100", "count": 1, "devices": [{"type": "A100-40GB", "count": 1}]},
        {"name": "t4", "count": 2, "devices": [{"type": "T4", "count": 1}], "price_per_hour": 0.5},
    ],
}
SIZES = [1, 2]
CHEAP = replace(OPTS, refine=False, top_k=1)  # the brute force's planner: any planner will do, if shared
# types that differ by more than one factor (the A100 much better at the last block): the LP then
# splits blocks by type and the closed form alone is below it
PROFILE = make_profile(
    4,
    per_block={
        "A100-40GB": [(0.010, 0.020)] * 3 + [(0.002, 0.004)],
        "V100-16GB": [(0.020, 0.040)] * 4,
        "T4": [(0.030, 0.060)] * 3 + [(0.090, 0.180)],
    },
    params=1000,
)


def _space():
    data = _base()
    return what_if_space(parse_cluster(data, file="base"), data, parse_pool(POOL, file="pool"))


def _bounds(space) -> tuple[CandidateBounds, list[tuple[int, ...]], np.ndarray]:
    types = sorted({t for k in space.kinds for t in k.devices})
    tables = CostTables(PROFILE, space.cluster(tuple(k.hi for k in space.kinds)), optimizer=OPTS.optimizer)
    bounds = CandidateBounds(PROFILE, tables, types, SIZES, OPTS.global_batch)
    counts = [c for c in itertools.product(*space.levels) if sum(c)]
    n = np.array([bounds.vector(space.type_counts(c)) for c in counts], dtype=float)
    return bounds, counts, n


def test_memoised_lp_is_the_planners_lp() -> None:
    space = _space()
    bounds, counts, _ = _bounds(space)
    for c in counts:
        cluster = space.cluster(c)
        tables = CostTables(PROFILE, cluster, optimizer=OPTS.optimizer)
        expected = compute_lower_bound(tables, cluster, OPTS.global_batch, SIZES)
        assert bounds.lp(space.type_counts(c)) == pytest.approx(expected, rel=1e-9)


def test_fast_bounds_stay_below_the_lp_and_each_lp_makes_its_own_tight() -> None:
    space = _space()
    bounds, counts, n = _bounds(space)
    groups = bounds.groups(n)
    before = bounds.fast(n, groups)  # the speed-proportional dual point alone
    lps = np.array([bounds.lp(space.type_counts(c)) for c in counts])
    after = bounds.fast(n, groups)  # and every dual point the LPs above returned
    assert bounds.cuts > 1
    assert np.all(before <= after + 1e-12) and np.all(after <= lps * (1 + 1e-9))
    assert np.any(before < lps * (1 - 1e-6))  # the closed form alone is not the LP everywhere
    # each row's own LP dual point reproduces its LP (strong duality): the cuts are as tight as can be
    assert np.allclose(after, lps, rtol=1e-6)


@functools.cache
def _planned(counts: tuple[int, ...]):
    try:
        return plan_training(PROFILE, _space().cluster(counts), CHEAP)
    except HetplanError:
        return None


def _plan(profile, cluster, opts):
    space = _space()
    result = _planned(tuple(sum(1 for n in cluster.nodes if n.name in k.names) for k in space.kinds))
    if result is None:
        raise HetplanError("no plan")
    return result


@pytest.mark.parametrize("objective", [Objective("fastest"), Objective("cheapest-per-step")], ids=lambda o: o.name)
def test_wider_pool_equals_brute_force(objective: Objective) -> None:
    # 23 candidates over four types: the LP's dual points raise other rows' bounds and the dive
    # plans the best plan's neighbours first; neither may change the answer
    space = _space()
    result = what_if(PROFILE, space, OPTS, objective, plan=_plan, marginals=False)
    best = None
    for counts in itertools.product(*space.levels):
        planned = _planned(counts) if sum(counts) else None
        if planned is None:
            continue
        t = planned.sim.iteration_s
        key = objective.key(t, space.price_per_hour(counts), space.devices(counts), space.moved(counts), counts)
        best = min(best, (key, counts)) if best else (key, counts)
    assert result.exact and result.chosen.counts == best[1]
    assert len(result.evaluated) < result.candidates
    for ev in result.evaluated.values():
        assert ev.result is None or ev.bound_s <= ev.iteration_s * (1 + 1e-9)

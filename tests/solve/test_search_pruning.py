"""The planning-speed rules of the search are exact: each one is checked against the plain
computation it replaces (docs/planner.md, "Planning speed").

* water-filling on tables (numpy) against the heap, one sample at a time;
* the partition DP on reachable blocks, values only, backtracked, caps bisected for one
  micro-batch, against the whole-matrix argmin DP it replaces;
* a stage's cost from its fastest plain and recomputation options, the option found afterwards,
  against the argmin over every option's matrix;
* a structure's bound is never above any of its candidates' estimates, and the search that
  evaluates structures best bound first ranks the same candidates as evaluating every one;
* the content caches (stage costs, partitions) give what a fresh computation gives.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random

import numpy as np
import pytest
from builders import make_cluster
from hypothesis import given, settings
from hypothesis import strategies as st
from test_optimality import tp_profile

from hetplan.contracts import load_catalog, load_cluster
from hetplan.profile.analytic import analytic_profile
from hetplan.solve import PlanOptions
from hetplan.solve.batching import TimeTable, allocate_batch
from hetplan.solve.partition import _NO_PRUNE_LIMIT, Slot, SlotCosts, _solve_cuts, default_tp_link, partition
from hetplan.solve.search import _Search, search_plans, simulate_or_none
from hetplan.solve.structures import candidate_structures
from hetplan.solve.tables import CostTables

TYPES = ["A100-80GB", "V100-16GB", "T4"]


# ---------------------------------------------------------------- water-filling
def _heap_allocation(global_batch: int, times: list) -> list[int]:
    """The water-filling as it was written first: one sample at a time, a heap of next steps."""
    shares = [1] * len(times)
    heap = [(times[p](2), p) for p in range(len(times))]
    heapq.heapify(heap)
    for _ in range(global_batch - len(times)):
        _, p = heapq.heappop(heap)
        shares[p] += 1
        heapq.heappush(heap, (times[p](shares[p] + 1), p))
    return shares


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    kinds=st.lists(st.sampled_from(["walk", "steps", "flat"]), min_size=1, max_size=6),
    extra=st.integers(0, 40),
    seed=st.integers(0, 10_000),
)
def test_water_filling_on_tables_is_the_heap(kinds, extra, seed) -> None:
    # tables that fall as well as rise (a larger micro-batch can be faster for more samples),
    # ties between pipelines and within one, infinite steps, and pipelines sharing one table
    rng = random.Random(seed)
    batch = len(kinds) + extra
    tables: list[TimeTable] = []
    for kind in kinds:
        if tables and rng.random() < 0.3:
            tables.append(rng.choice(tables))
            continue
        if kind == "walk":
            values = np.cumsum([rng.uniform(-1.0, 2.0) for _ in range(batch + 2)])
        elif kind == "steps":
            values = np.round(np.cumsum([rng.uniform(-1.0, 2.0) for _ in range(batch + 2)]))
        else:
            values = np.array([rng.choice([0.5, 1.0, 2.0, math.inf]) for _ in range(batch + 2)])
        tables.append(TimeTable(values))
    assert allocate_batch(batch, tables) == _heap_allocation(batch, tables)


# ---------------------------------------------------------------- the partition DP
def _reference_cuts(stage: list[np.ndarray], cuts_cost: list[np.ndarray], weight: int, n: int):
    """The DP as it was written first: whole matrices, an argmin per stage, every cap scanned."""
    n_stages = len(stage)
    inf = float("inf")
    idx = np.arange(n + 1)
    comm = [cuts_cost[s][:, None] for s in range(n_stages)]
    cycle = [np.maximum(stage[s], comm[s]) for s in range(n_stages)]

    def solve(cap):
        value = np.full((n_stages + 1, n + 1), inf)
        choice = np.zeros((n_stages + 1, n + 1), dtype=np.int64)
        value[0, 0] = 0.0
        for s in range(1, n_stages + 1):
            prev = value[s - 1][:, None]
            if cap is None:
                cand = np.maximum(prev, cycle[s - 1])
            else:
                cand = np.where(cycle[s - 1] <= cap, prev + stage[s - 1] + comm[s - 1], inf)
            k = np.argmin(cand, axis=0)
            choice[s] = k
            value[s] = cand[k, idx]
        return value, choice

    value, _ = solve(None)
    bottleneck = value[n_stages, n]
    if not np.isfinite(bottleneck):
        return None
    value, choice = solve(bottleneck * (1 + 1e-12) + 1e-15)
    best_objective, best_choice = weight * bottleneck + value[n_stages, n], choice
    if weight < _NO_PRUNE_LIMIT:
        floor = solve(inf)[0][n_stages, n]
        caps = np.unique(np.concatenate([c[np.isfinite(c)] for c in cycle]))
        for cap in caps[caps > bottleneck * (1 + 1e-12)]:
            if weight * cap + floor >= best_objective:
                break
            value, choice = solve(cap * (1 + 1e-12))
            total = value[n_stages, n]
            if weight * cap + total < best_objective * (1 - 1e-12):
                best_objective, best_choice = weight * cap + total, choice
    cuts = [n]
    for s in range(n_stages, 0, -1):
        cuts.append(int(best_choice[s, cuts[-1]]))
    return float(best_objective), cuts[::-1]


@settings(max_examples=250, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 12),
    n_stages=st.integers(1, 5),
    weight=st.sampled_from([0, 0, 1, 2, 3, 7, 8, 20]),
    seed=st.integers(0, 10_000),
    repeated=st.booleans(),
)
def test_the_dp_is_the_whole_matrix_dp(n, n_stages, weight, seed, repeated) -> None:
    # repeated: identical blocks, so that many ranges tie exactly or within a few ulps (prefix
    # differences), which is where a different cap order or tie rule would show
    if n_stages > n:
        return
    rng = random.Random(seed)
    per_block = [1.0] * n if repeated else [rng.uniform(0.1, 3.0) for _ in range(n)]
    stage = []
    for _ in range(n_stages):
        speed = rng.choice([1.0, 2.0, 0.7])
        prefix = np.concatenate([[0.0], np.cumsum(np.array(per_block) / speed)])
        matrix = prefix[None, :] - prefix[:, None]
        matrix[np.arange(n + 1)[:, None] >= np.arange(n + 1)[None, :]] = np.inf
        matrix[np.asarray([[rng.random() < 0.15 for _ in range(n + 1)] for _ in range(n + 1)])] = np.inf  # no fit
        stage.append(matrix)
    cuts_cost = [np.zeros(n + 1)] + [
        np.concatenate([[0.0], np.full(n, rng.choice([0.0, 0.3, 1.0]))]) for _ in range(n_stages - 1)
    ]
    assert _solve_cuts(stage, cuts_cost, weight, n) == _reference_cuts(stage, cuts_cost, weight, n)


def test_stage_costs_pick_the_first_fastest_option_that_fits() -> None:
    # a V100 pair that must split or recompute: every range's cost and option against the argmin
    # over each option's own matrix (degree 1 before 2, no recomputation, then full, selective)
    profile = tp_profile(
        {t: [(1.0, 2.0)] * 6 for t in TYPES},
        n_blocks=6,
        params=10_000_000,
        activation_bytes=3e9,
        output_bytes=1e7,
        tp_speedup=1.2,
        allreduce_bytes=1e8,
        pair=1.5,
    )
    cluster = make_cluster([("n0", [("V100-16GB", 2)])])
    tables = CostTables(profile, cluster, optimizer="sgd")
    costs = SlotCosts(tables, default_tp_link(tables))
    slot = Slot.of(list(cluster.devices))
    capped = 0
    for held, cap in itertools.product((1, 3), (None, 5.0, 40.0)):
        cost = costs.stage_matrix(slot, 2, held, pipelines=1, zero=False, allowed=None)
        if cap is not None and not cost.short:
            continue
        capped += cap is not None
        matrices = []
        for option, time, fit in zip(cost.options, cost.times, cost.fits, strict=True):
            if option[1] != "none" and cap is None:
                matrices.append(np.full(time.shape, np.inf))
                continue
            keep = fit & (time < cap) if option[1] != "none" else fit
            matrices.append(np.where(keep, time, np.inf))
        stacked = np.stack(matrices)
        best = cost.best(cap)
        np.testing.assert_array_equal(best, stacked.min(axis=0))
        pick = np.argmin(stacked, axis=0)
        for i, j in zip(*np.nonzero(np.isfinite(best)), strict=True):
            assert cost.option_at(i, j, cap, float(best[i, j])) == cost.options[pick[i, j]]
    assert capped  # recomputation was priced


def test_shared_caches_give_what_a_fresh_computation_gives() -> None:
    # one SlotCosts for many calls (content-keyed stage costs and partitions) against a fresh one each time
    rng = random.Random(3)
    profile = tp_profile(
        {t: [(rng.uniform(0.2, 2.0), rng.uniform(0.2, 3.0)) for _ in range(8)] for t in TYPES},
        n_blocks=8,
        params=300_000_000,
        activation_bytes=1e9,
        output_bytes=1e8,
        tp_speedup=1.9,
        allreduce_bytes=1e6,
        pair=1.5,
    )
    cluster = make_cluster([("n0", [("V100-16GB", 2), ("A100-80GB", 1)]), ("n1", [("T4", 2)])], inter="10GB/s")
    tables = CostTables(profile, cluster, optimizer="adam")
    shared = SlotCosts(tables, default_tp_link(tables))
    v100s, a100, t4s = cluster.devices[:2], cluster.devices[2], cluster.devices[3:]
    orders = [[Slot.of(v100s), Slot.of([a100])], [Slot.of([a100]), Slot.of(t4s)], [Slot.of(v100s)]]
    for slots, m, n_micro, pipelines, zero in itertools.product(orders, (1, 2), (1, 3, 9), (1, 2, 5), (False, True)):
        links = [cluster.link(a.devices[0], b.devices[0]) for a, b in itertools.pairwise(slots)]
        kwargs = dict(m=m, n_micro=n_micro, schedule="1f1b", links=links, pipelines=pipelines, zero=zero)
        fresh = partition(tables, slots, costs=SlotCosts(tables, default_tp_link(tables)), **kwargs)
        assert partition(tables, slots, costs=shared, **kwargs) == fresh


# ---------------------------------------------------------------- bounds and the ranked search
def _gpt(cluster, layers: int = 4):
    catalog = load_catalog()
    config = {"layers": layers, "hidden": 1024, "heads": 16, "seq": 2048, "vocab": 50272}
    return analytic_profile("gpt", config, devices=[catalog.get(t) for t in cluster.device_types], dtype="fp16")


@pytest.mark.parametrize(("name", "batch"), [("mixed-small", 64), ("v100-t4", 256)])
def test_no_candidate_beats_its_structures_bound(name: str, batch: int) -> None:
    cluster = load_cluster(f"profiles/clusters/{name}.yaml")
    profile = _gpt(cluster)
    search = _Search(profile, cluster, PlanOptions(global_batch=batch, baselines=False))
    structures = list(candidate_structures(cluster, n_blocks=len(profile.blocks), max_pipelines=batch))
    checked = 0
    for structure in structures[:: max(1, len(structures) // 40)]:
        bound = search.bound(structure)
        for found in search.found(structure):
            assert found.estimate >= bound
            checked += 1
    assert checked


def test_best_bound_first_ranks_like_evaluating_every_structure() -> None:
    # the lazy search simulates exactly the candidates, in the order, of sorting them all
    cluster = load_cluster("profiles/clusters/v100-t4.yaml")
    profile = _gpt(cluster)
    opts = PlanOptions(global_batch=256, baselines=False, top_k=5)
    searched = search_plans(profile, cluster, opts)
    search = _Search(profile, cluster, opts)
    structures = list(candidate_structures(cluster, n_blocks=len(profile.blocks), max_pipelines=256))
    every = [(f.estimate, i, k, f) for i, s in enumerate(structures) for k, f in enumerate(search.found(s))]
    every.sort(key=lambda x: x[:3])
    expected, seen = [], set()
    for *_, f in every:
        plan = f.plan(opts)
        key = str(plan.to_dict()["pipelines"])
        if key in seen:
            continue
        seen.add(key)
        if simulate_or_none(plan, profile, cluster) is not None:
            expected.append(key)
        if len(expected) >= opts.top_k:
            break
    assert expected
    assert [str(c.plan.to_dict()["pipelines"]) for c in searched.scored] == expected

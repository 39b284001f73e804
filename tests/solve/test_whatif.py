"""What-if search: the branch and bound picks exactly what planning every candidate picks."""

from __future__ import annotations

import functools
import itertools

import pytest
from builders import make_profile

from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.pool import parse_pool
from hetplan.errors import HetplanError
from hetplan.solve.search import PlanOptions
from hetplan.solve.training import plan_training
from hetplan.solve.whatif import Objective, what_if, what_if_space
from hetplan.solve.whatif_report import pareto_front, what_if_summary

# per block (fwd, bwd) seconds per sample: A100 fastest, V100 next; a T4 so slow that one sample
# of one block on it takes longer than the whole batch on the V100 (it can only slow a plan)
PROFILE = make_profile(
    4,
    times={"A100-40GB": (0.010, 0.020), "V100-16GB": (0.020, 0.040), "T4": (0.500, 1.000)},
    params=1000,
    output_bytes=4e6,
)
OPTS = PlanOptions(global_batch=8, micro_batch_sizes=(1, 2), baselines=False)


def _base(network: str = "100Gbps") -> dict:
    return {
        "schema": "hetplan/cluster/v1",
        "name": "base",
        "nodes": [
            {"name": "v0", "devices": [{"type": "V100-16GB", "count": 1}]},
            {"name": "t0", "devices": [{"type": "T4", "count": 1}], "price_per_hour": 0.5},
        ],
        "network": {"bandwidth": network, "latency": "10us"},
    }


POOL = {
    "schema": "hetplan/pool/v1",
    "nodes": [{"name": "a100", "count": 1, "devices": [{"type": "A100-40GB", "count": 1}]}],
}


def _space(network: str = "100Gbps", pool: dict | None = POOL):
    data = _base(network)
    return what_if_space(parse_cluster(data, file="base"), data, parse_pool(pool, file="pool") if pool else None)


@functools.cache
def _planned(network: str, counts: tuple[int, ...]):
    """One plan per candidate, shared by the search and the brute force (the same planner)."""
    space = _space(network)
    try:
        return plan_training(PROFILE, space.cluster(counts), OPTS)
    except HetplanError:
        return None


def _planner(network: str):
    space = _space(network)

    def plan(profile, cluster, opts):
        counts = tuple(sum(1 for n in cluster.nodes if n.name in k.names) for k in space.kinds)
        result = _planned(network, counts)
        if result is None:
            raise HetplanError("no plan")
        return result

    return plan


def _brute_force(network: str, objective: Objective):
    space = _space(network)
    best = None
    for counts in itertools.product(*space.levels):
        if sum(counts) == 0:
            continue
        result = _planned(network, counts)
        price = space.price_per_hour(counts)
        if result is None:
            continue
        t = result.sim.iteration_s
        if objective.max_iteration_s is not None and t > objective.max_iteration_s:
            continue
        if objective.budget_per_hour is not None and price > objective.budget_per_hour:
            continue
        key = objective.key(t, price, space.devices(counts), space.moved(counts), counts)
        if best is None or key < best[0]:
            best = (key, counts, result)
    return best


OBJECTIVES = [
    Objective("fastest"),
    Objective("cheapest-per-step"),
    Objective("cheapest-run", run_samples=10_000),
    Objective("fastest-within-budget", budget_per_hour=4.0),
]


@pytest.mark.parametrize("network", ["100Gbps", "1Gbps"])
@pytest.mark.parametrize("objective", OBJECTIVES, ids=lambda o: o.name)
def test_search_equals_brute_force(network: str, objective: Objective) -> None:
    space = _space(network)
    result = what_if(PROFILE, space, OPTS, objective, plan=_planner(network), marginals=False)
    _key, counts, plan = _brute_force(network, objective)
    assert result.exact
    assert result.chosen.counts == counts
    assert result.chosen.result.plan.to_dict() == plan.plan.to_dict()
    # every bound held: no planned candidate beat its bound
    for ev in result.evaluated.values():
        if ev.result is not None:
            assert ev.bound_s <= ev.iteration_s * (1 + 1e-9)


def test_meeting_a_deadline_equals_brute_force_and_prunes() -> None:
    network = "100Gbps"
    fastest = _brute_force(network, Objective("fastest"))[2].sim.iteration_s
    objective = Objective("cheapest-meeting", max_iteration_s=fastest * 1.5)
    result = what_if(PROFILE, _space(network), OPTS, objective, plan=_planner(network), marginals=False)
    assert result.chosen.counts == _brute_force(network, objective)[1]
    assert result.chosen.iteration_s <= objective.max_iteration_s
    assert len(result.evaluated) < result.candidates  # bounds ruled some out unplanned


def test_a_t4_that_slows_the_plan_is_dropped_under_fastest() -> None:
    # the T4 node cannot speed any plan up (PROFILE): the planner leaves it idle or is slowed by it
    network = "1Gbps"
    space = _space(network, pool=None)
    result = what_if(PROFILE, space, OPTS, Objective("fastest"), plan=_planner_nopool(network))
    names = [k.name for k in space.kinds]
    assert result.chosen.counts[names.index("t0")] == 0
    with_t4 = _planned_nopool(network, (1, 1))
    assert with_t4.sim.iteration_s >= result.chosen.iteration_s
    assert any("t0" in n and "dropping it wins" in n for n in result.notes)


@functools.cache
def _planned_nopool(network: str, counts: tuple[int, ...]):
    return plan_training(PROFILE, _space(network, pool=None).cluster(counts), OPTS)


def _planner_nopool(network: str):
    space = _space(network, pool=None)

    def plan(profile, cluster, opts):
        return _planned_nopool(network, tuple(sum(1 for n in cluster.nodes if n.name in k.names) for k in space.kinds))

    return plan


def test_summary_pareto_front_is_non_dominated() -> None:
    network = "100Gbps"
    result = what_if(PROFILE, _space(network), OPTS, Objective("cheapest-per-step"), plan=_planner(network))
    summary = what_if_summary(result, run_samples=800)
    front = pareto_front(summary["rows"])
    assert front
    priced = [r for r in summary["rows"] if r.get("usd_per_step") is not None]
    for f in front:
        assert not any(r["iteration_s"] <= f["iteration_s"] and r["usd_per_step"] < f["usd_per_step"] for r in priced)
    assert summary["chosen"]["usd_per_run"] == pytest.approx(100 * summary["chosen"]["usd_per_step"])


def test_a_cost_objective_needs_every_price() -> None:
    data = _base()
    del data["nodes"][1]["price_per_hour"]  # T4 has no catalog price
    space = what_if_space(parse_cluster(data, file="base"), data, None)
    with pytest.raises(HetplanError, match="needs a price for every node; none known for t0"):
        what_if(PROFILE, space, OPTS, Objective("cheapest-per-step"))


def test_ladder_caps_large_kinds() -> None:
    pool = {"schema": "hetplan/pool/v1", "nodes": [{"name": "a", "count": 64, "devices": [{"type": "T4"}]}]}
    data = _base()
    space = what_if_space(parse_cluster(data, file="base"), data, parse_pool(pool, file="pool"), ladder=8)
    assert space.levels[-1] == (0, 1, 2, 3, 4, 8, 16, 32, 64)
    assert space.laddered

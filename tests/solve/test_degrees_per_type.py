"""A profile may time a tensor-parallel degree on some device types only (Sailor's OPT-350 has
degree 8 on the V100 and not on the A100-40): the search, the Megatron-style and homogeneous
baselines and the plan's explanation offer a degree to a slot only where every block of the range
has times for its types at that degree. Planning raised "has no times for A100-40GB at
tensor-parallel degree 8" before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from builders import make_cluster, make_profile

from hetplan.contracts.model_profile import TensorParallel, Timing
from hetplan.simulate import simulate
from hetplan.simulate.costs import block_costs
from hetplan.solve import PlanOptions, plan_training

A100, V100 = "A100-80GB", "V100-16GB"
SAILOR = Path(__file__).resolve().parents[2].parent / "shared" / "external" / "sailor" / "profiles.json"


def _profile_with_degree_2_on_the_v100_only():
    profile = make_profile(
        4, times={A100: (1.0, 2.0), V100: (2.0, 4.0)}, params=1000, activation_bytes=1e3, output_bytes=1e3
    )
    for i, block in enumerate(profile.blocks):
        half = TensorParallel(
            params=500,
            param_bytes=2000.0,
            activation_bytes=500.0,
            allreduce_bytes=0.0,
            times={V100: {1: Timing(fwd=0.5, bwd=1.0, source="estimated")}},  # 4x faster: worth taking
        )
        profile.blocks[i] = replace(block, tensor_parallel={2: half})
    return profile


def test_a_degree_timed_on_one_type_is_planned_on_that_type_only() -> None:
    profile = _profile_with_degree_2_on_the_v100_only()
    cluster = make_cluster([("n0", [(A100, 2)]), ("n1", [(V100, 2)])])
    result = plan_training(profile, cluster, PlanOptions(global_batch=8))
    for p in [result.plan, *(c.plan for c in result.baselines.values() if c is not None)]:
        for stage in (s for pipe in p.pipelines for s in pipe.stages):
            types = {cluster.device(a).type.name for a in stage.devices}
            assert stage.tensor_parallel == 1 or types == {V100}, p.to_dict()
    # the V100 stages do take the degree it has (it is 4x faster there): the search saw it
    assert any(s.tensor_parallel == 2 for pipe in result.plan.pipelines for s in pipe.stages)
    assert simulate(result.plan, profile, cluster).iteration_s == pytest.approx(result.sim.iteration_s)


def test_block_costs_are_nan_where_the_type_has_no_times_at_the_degree() -> None:
    profile = _profile_with_degree_2_on_the_v100_only()
    cluster = make_cluster([("n0", [(A100, 2)])])
    link = cluster.node("n0").link
    fwd, bwd = block_costs(profile, cluster.device("n0/0").type, 1, tp=2, link=link)
    assert all(f != f for f in fwd) and all(b != b for b in bwd)


@pytest.mark.skipif(not SAILOR.is_file(), reason="../shared/external is absent (Sailor's real profiles)")
def test_sailor_opt350_plans_on_a100s_beside_v100s() -> None:
    from hetplan.contracts import load_cluster
    from hetplan.profile.importers import import_sailor

    root = Path(__file__).resolve().parents[2]
    cluster = load_cluster(root / "profiles" / "clusters" / "a100-40-v100.yaml")
    profile = import_sailor(SAILOR, model="OPT-350", gpu_types=list(cluster.device_types))
    assert 8 in profile.tp_degrees(1) and 8 not in profile.tp_degrees(1, cluster.catalog.get("A100-40GB"))
    result = plan_training(profile, cluster, PlanOptions(global_batch=512))
    assert result.sim.iteration_s > 0


def test_why_a_stage_runs_as_it_does_prices_only_the_degrees_its_type_has() -> None:
    """A stage of two A100s: degree 2 has no A100 times, so the explanation leaves it out (it
    priced it at 0 s and called it faster)."""
    from hetplan.contracts.plan import Pipeline, Plan, Stage
    from hetplan.solve.explain import explain_plan
    from hetplan.solve.search import search_plans

    profile = _profile_with_degree_2_on_the_v100_only()
    cluster = make_cluster([("n0", [(A100, 2)]), ("n1", [(V100, 2)])])
    searched = search_plans(profile, cluster, PlanOptions(global_batch=8))
    stages = (Stage(0, 4, ("n0/0", "n0/1"), (0.5, 0.5)),)
    plan = Plan(8, [Pipeline(8, (2, 2, 2, 2), stages)])
    [entry] = explain_plan(plan, searched.search.tables, searched.search.slot_costs, cluster, None)["stages"]
    assert "degree 2" not in entry["why"] and "TP 2" not in entry["why"], entry
    assert entry["why"].startswith("TP 1: the only degree")

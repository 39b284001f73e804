"""Which parameters a measured run's simulation reads: tensor-parallel groups read their node's link
and the collective efficiency (their all-reduces run inside every block)."""

from __future__ import annotations

import copy
from typing import Any

from hetplan.calibrate.inputs import Observation
from hetplan.calibrate.params import Model, candidate_params
from hetplan.calibrate.relevance import relevance
from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.cluster import Cluster, parse_cluster
from hetplan.contracts.model_profile import Block, ModelProfile, TensorParallel, Timing
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.schedule.compile import compile_plan
from hetplan.simulate import simulate

A100 = "A100-80GB"

RAW: dict[str, Any] = {
    "schema": "hetplan/cluster/v1",
    "name": "one-node",
    "nodes": [
        {"name": "n0", "devices": [{"type": A100, "count": 2}], "link": {"bandwidth": "10GB/s", "latency": "5us"}}
    ],
    "network": {"bandwidth": "1GB/s", "latency": "5us"},
}


def _profile() -> ModelProfile:
    """Two blocks with a degree-2 shard that all-reduces 100 MB a sample (TP traffic, no transfers)."""
    blocks = []
    for i in range(2):
        one = {A100: {1: Timing(0.01, 0.02, "estimated")}}
        half = {A100: {1: Timing(0.006, 0.012, "estimated")}}
        shard = TensorParallel(params=500, param_bytes=2000.0, activation_bytes=1e3, allreduce_bytes=1e8, times=half)
        blocks.append(
            Block(
                name=f"b{i}",
                kind="test",
                params=1000,
                param_bytes=4000.0,
                activation_bytes=2e3,
                output_bytes=800.0,
                flops_fwd=0.0,
                times=one,
                tensor_parallel={2: shard},
            )
        )
    return ModelProfile(model={"name": "tp"}, dtype="fp32", blocks=blocks, input_bytes=100.0)


def _observation(plan: Plan) -> Observation:
    return Observation(name="tp2", plan=plan, compiled=compile_plan(plan, 2), iteration_s=1.0)


def _tp2_case(optimizer: str) -> tuple[ModelProfile, Cluster, list, Model, Plan]:
    """The profile, cluster, candidate parameters and model of one node, and a TP 2 plan on it."""
    profile = _profile()
    cluster = parse_cluster(copy.deepcopy(RAW), file="cluster.yaml", catalog=load_catalog())
    params = candidate_params(RAW, cluster, profile)
    model = Model(profile, RAW, cluster, load_catalog(), params)
    stage = Stage(0, 2, ("n0/0", "n0/1"), (1.0,), tensor_parallel=2)
    return profile, cluster, params, model, Plan(2, [Pipeline(2, (1, 1), (stage,))], optimizer=optimizer)


def test_a_tensor_parallel_run_reads_its_node_link_and_the_collective_efficiency() -> None:
    profile, cluster, params, model, plan = _tp2_case("sgd")
    reads = {params[j].name for j in relevance(model, [_observation(plan)])[0]}
    # the simulation really moves with the node's link: a 10x slower link is a slower iteration
    slow = copy.deepcopy(RAW)
    slow["nodes"][0]["link"]["bandwidth"] = "1GB/s"
    fast_s = simulate(plan, profile, cluster).iteration_s
    slow_s = simulate(plan, profile, parse_cluster(slow, file="cluster.yaml", catalog=load_catalog())).iteration_s
    assert slow_s > 1.5 * fast_s
    assert {"bandwidth[node n0]", "latency[node n0]", "collective_efficiency", f"compute[{A100}]"} <= reads
    assert "bandwidth[network]" not in reads  # one node: nothing crosses the network


def test_a_plain_single_device_run_reads_no_link() -> None:
    profile = _profile()
    cluster = parse_cluster(copy.deepcopy(RAW), file="cluster.yaml", catalog=load_catalog())
    params = candidate_params(RAW, cluster, profile)
    model = Model(profile, RAW, cluster, load_catalog(), params)
    plan = Plan(global_batch=2, pipelines=[Pipeline(2, (1, 1), (Stage(0, 2, ("n0/0",), (1.0,)),))], optimizer="sgd")
    reads = {params[j].name for j in relevance(model, [_observation(plan)])[0]}
    assert reads == {f"compute[{A100}]"}
    # with a run log's per-rank compute, the type's per-call overhead too; no collective beside a
    # backward, so no overlap slowdown
    logged = Observation(
        name="one", plan=plan, compiled=compile_plan(plan, 2), iteration_s=1.0, compute_s={"n0/0": 0.5}
    )
    reads = {params[j].name for j in relevance(model, [logged])[0]}
    assert reads == {f"compute[{A100}]", f"overhead[{A100}]"}


def test_a_tied_copys_all_reduce_reads_the_links_and_the_collective_efficiency() -> None:
    """Two stages holding the two ends of a tied table: their only collective is the table's
    gradient all-reduce, which the simulation prices over the node's link at the collective
    efficiency; relevance sees them (it read only the plan's own gradient groups before)."""
    from dataclasses import replace

    from hetplan.contracts.model_profile import SharedParams

    profile = replace(_profile(), shared=[SharedParams("table", 50_000_000, 2e8, (0, 1))])
    cluster = parse_cluster(copy.deepcopy(RAW), file="cluster.yaml", catalog=load_catalog())
    params = candidate_params(RAW, cluster, profile)
    model = Model(profile, RAW, cluster, load_catalog(), params)
    stages = (Stage(0, 1, ("n0/0",), (1.0,)), Stage(1, 2, ("n0/1",), (1.0,)))
    plan = Plan(global_batch=2, pipelines=[Pipeline(2, (1, 1), stages)], optimizer="sgd")
    reads = {params[j].name for j in relevance(model, [_observation(plan)])[0]}
    assert {"bandwidth[node n0]", "collective_efficiency"} <= reads
    slower = copy.deepcopy(RAW) | {"collective_efficiency": 0.5}
    moved = parse_cluster(slower, file="cluster.yaml", catalog=load_catalog())
    assert simulate(plan, profile, moved).iteration_s > simulate(plan, profile, cluster).iteration_s


def test_the_fit_keeps_each_runs_memory_walk_because_no_parameter_moves_it() -> None:
    """The fit walks a run's memory once (``Problem._memory``): every candidate parameter, moved
    far from its input value, leaves a fresh walk equal to the kept one."""
    import numpy as np

    from hetplan.calibrate.fit import Problem

    _, _, params, model, plan = _tp2_case("adam")
    problem = Problem(model, [_observation(plan)])
    active = list(range(len(params)))
    kept = problem.simulate(np.zeros(len(params)), [0], active)[0]
    moved_theta = np.full(len(params), 2.0)
    moved = problem.simulate(moved_theta, [0], active)[0]
    built = model.build({p: p.value(2.0) for p in params})
    fresh = simulate(plan, *built)
    assert moved.iteration_s == fresh.iteration_s != kept.iteration_s
    assert {a: d.memory for a, d in moved.devices.items()} == {a: d.memory for a, d in fresh.devices.items()}

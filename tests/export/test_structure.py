"""The uniform structure behind every export: stage count, replicas, idle devices, rank order."""

from __future__ import annotations

from conftest import SCENARIOS, pipeline, stage

from hetplan.contracts.plan import load_plan, load_plan_inputs
from hetplan.export import deepspeed, megatron, torchtitan
from hetplan.export.structure import _structure, uniform_structure
from hetplan.simulate import simulate


def _load(write_plan, name: str, **scenario):
    plan = load_plan(write_plan(name, **scenario))
    profile, cluster = load_plan_inputs(plan)
    return plan, profile, cluster


def test_of_several_stage_counts_the_fastest_structure_is_chosen(write_plan) -> None:
    plan, profile, cluster = _load(write_plan, "p", **SCENARIOS["stage_counts"])
    for runtime in (deepspeed.RUNTIME, megatron.RUNTIME, torchtitan.RUNTIME):
        chosen = uniform_structure(plan, profile, cluster, runtime)
        times = {
            s: simulate(_structure(plan, profile, cluster, runtime, s).plan(plan), profile, cluster).iteration_s
            for s in (2, 3)
        }
        assert times[chosen.stages] == min(times.values()), (runtime.name, times)


def test_the_slowest_devices_are_left_idle_and_replicas_divide_the_batch(write_plan) -> None:
    plan, profile, cluster = _load(write_plan, "p", **SCENARIOS["replicated_stage"])
    u = uniform_structure(plan, profile, cluster, megatron.RUNTIME)
    assert (u.stages, u.replicas, u.micro_batch, u.micro_batches) == (2, 2, 4, 4)
    assert sorted(u.ranks) == ["n0/0", "n0/1", "n1/0", "n1/1"]  # n1/2: a V100, the last of the slowest
    odd = _load(
        write_plan,
        "odd",
        pipelines=[  # 3 pipelines, global batch 40: 3 replicas would not divide it, so 2
            pipeline(14, [2] * 7, stage(0, 7, "n0/0"), stage(7, 14, "n1/0")),
            pipeline(14, [2] * 7, stage(0, 7, "n0/1"), stage(7, 14, "n1/1")),
            pipeline(12, [2] * 6, stage(0, 7, "n0/2"), stage(7, 14, "n1/2")),
        ],
    )
    u = uniform_structure(*odd, torchtitan.RUNTIME)
    assert (u.replicas, u.global_batch, u.micro_batch * u.micro_batches * u.replicas) == (2, 40, 40)
    assert any(line.startswith("2 device(s) left idle") and "3 replicas would not divide" in line for line in u.dropped)


def test_torchrun_keeps_the_plans_placement_for_every_runtime(write_plan) -> None:
    plan, profile, cluster = _load(write_plan, "p", **SCENARIOS["three_stages_gpipe_sgd"])
    # every export starts its ranks with torchrun, one script a node, which lists a node's devices in
    # any order: the same devices on the same stages as in the plan
    for runtime in (torchtitan.RUNTIME, deepspeed.RUNTIME):
        u = uniform_structure(plan, profile, cluster, runtime)
        for s in range(3):
            assert {u.device(s, r) for r in range(2)} == {p.stages[s].devices[0] for p in plan.pipelines}
        assert [n for n, _ in u.nodes()] == ["n0", "n1"]


def test_more_stages_than_the_runtime_can_cut_are_capped(inputs, write_plan) -> None:
    from hetplan.contracts.catalog import load_catalog
    from hetplan.profile.analytic import analytic_profile

    catalog = load_catalog()
    small = analytic_profile(
        "gpt",
        {"layers": 2, "hidden": 64, "heads": 2, "seq": 16, "vocab": 128},
        devices=[catalog.get("A100-80GB"), catalog.get("V100-16GB")],
        micro_batches=(1, 2, 4),
    )
    small.save(inputs / "gpt2.yaml")  # blocks: embedding, layer0.attn, layer0.mlp, layer1.attn, layer1.mlp, head
    plan, profile, cluster = _load(
        write_plan,
        "deep",
        profile="gpt2.yaml",
        pipelines=[
            pipeline(
                8,
                [4, 4],
                stage(0, 1, "n0/0"),
                stage(1, 2, "n0/1"),
                stage(2, 3, "n0/2"),
                stage(3, 4, "n1/0"),
                stage(4, 6, "n1/1"),
            )
        ],
    )
    # a stage is whole layers; the embedding and the output may each be a stage alone: at most 4 stages
    for runtime in (megatron.RUNTIME, torchtitan.RUNTIME):
        u = uniform_structure(plan, profile, cluster, runtime)
        assert u.stages == 4 and u.cuts == (0, 1, 3, 5, 6)
        assert u.dropped[0] == (
            f"stage counts (pipeline 0: 5): every {runtime.title} pipeline has 4 (at most 4: {runtime.title} cannot "
            "cut this model finer)"
        )

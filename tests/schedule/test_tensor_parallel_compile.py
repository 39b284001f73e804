"""Tensor-parallel stages in the plan contract and the compiled schedule: replicas of ``t`` devices,
one share per replica, activations and gradients each delivered once to every member, gradient
groups per shard, and the plan's one-line refusals."""

from __future__ import annotations

import itertools

import pytest
from builders import make_cluster, make_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage, check_plan, parse_plan
from hetplan.errors import HetplanError
from hetplan.runtime.validate import validate_programs
from hetplan.schedule.compile import compile_plan

A100, V100 = "A100-80GB", "V100-16GB"


def _plan(stages: list[dict], micro: list[int], **extra) -> Plan:
    data = {
        "schema": "hetplan/plan/v1",
        "inputs": {"profile": {"path": "p.yaml"}, "cluster": {"path": "c.yaml"}},
        "global_batch": sum(micro),
        "pipelines": [{"batch": sum(micro), "micro_batches": micro, "stages": stages}],
        **extra,
    }
    return parse_plan(data, file="plan.yaml")


def test_a_tensor_parallel_stage_round_trips_with_one_share_per_replica() -> None:
    stage = {"blocks": [0, 4], "devices": ["n0/0", "n0/1", "n0/2", "n0/3"], "tensor_parallel": 2}
    plan = _plan([{**stage, "shares": [0.25, 0.75], "recompute": "selective"}], [4, 4], zero=1)
    s = plan.pipelines[0].stages[0]
    assert s.replicas == (("n0/0", "n0/1"), ("n0/2", "n0/3"))
    assert s.share_of("n0/3") == 0.75 and s.recompute == "selective" and plan.zero == 1
    again = parse_plan(plan.to_dict(), file="again.yaml")
    assert again.pipelines == plan.pipelines and again.zero == 1


@pytest.mark.parametrize(
    ("stage", "field", "words"),
    [
        ({"devices": ["n0/0", "n0/1", "n0/2"], "tensor_parallel": 2}, "tensor_parallel", "replicas"),
        ({"devices": ["n0/0", "n0/1"], "tensor_parallel": 2, "shares": [0.5, 0.5]}, "shares", "one per replica"),
        ({"devices": ["n0/0"], "recompute": "most"}, "recompute", "selective"),
    ],
)
def test_bad_tensor_parallel_stages_get_one_line(stage: dict, field: str, words: str) -> None:
    with pytest.raises(HetplanError) as err:
        _plan([{"blocks": [0, 4], **stage}], [2])
    assert field in str(err.value) and words in str(err.value) and "\n" not in str(err.value)


def test_a_block_has_one_degree_across_its_holders() -> None:
    data = {
        "schema": "hetplan/plan/v1",
        "inputs": {"profile": {"path": "p.yaml"}, "cluster": {"path": "c.yaml"}},
        "global_batch": 4,
        "pipelines": [
            {"batch": 2, "micro_batches": [2], "stages": [{"blocks": [0, 4], "devices": ["n0/0", "n0/1"],
                                                          "tensor_parallel": 2}]},
            {"batch": 2, "micro_batches": [2], "stages": [{"blocks": [0, 4], "devices": ["n0/2"]}]},
        ],
    }  # fmt: skip
    with pytest.raises(HetplanError, match="one degree"):
        parse_plan(data, file="plan.yaml")


def test_a_group_is_one_type_on_one_node() -> None:
    cluster = make_cluster([("n0", [(A100, 1), (V100, 1)]), ("n1", [(A100, 1)])])
    profile = make_profile(4, times={A100: (1.0, 2.0), V100: (2.0, 4.0)})
    for devices in (["n0/0", "n0/1"], ["n0/0", "n1/0"]):
        plan = _plan([{"blocks": [0, 4], "devices": devices, "tensor_parallel": 2}], [2])
        with pytest.raises(HetplanError, match="one type on one node"):
            check_plan(plan, cluster, profile)


def _tp_plan(t_first: int, t_second: int, replicas: tuple[int, int] = (1, 1)) -> Plan:
    first = [f"n0/{i}" for i in range(t_first * replicas[0])]
    second = [f"n1/{i}" for i in range(t_second * replicas[1])]
    stages = (
        Stage(0, 2, tuple(first), tuple(1 / replicas[0] for _ in range(replicas[0])), tensor_parallel=t_first),
        Stage(2, 4, tuple(second), tuple(1 / replicas[1] for _ in range(replicas[1])), tensor_parallel=t_second),
    )
    return Plan(global_batch=8, pipelines=[Pipeline(8, (4, 4), stages)], schedule="1f1b")


@pytest.mark.parametrize(
    ("t1", "t2", "replicas"), [(2, 2, (1, 1)), (1, 4, (1, 1)), (4, 1, (1, 1)), (2, 4, (1, 1)), (2, 1, (2, 3))]
)
def test_every_member_gets_each_tensor_once(t1: int, t2: int, replicas: tuple[int, int]) -> None:
    plan = _tp_plan(t1, t2, replicas)
    compiled = compile_plan(plan, 4)
    validate_programs({a: p.actions for a, p in compiled.programs.items()})
    for address, program in compiled.programs.items():
        assert program.tensor_parallel == (t1 if program.stage == 0 else t2)
        assert program.tp_group[program.tp_rank] == address if program.tp_group else program.tp_rank == 0
        for micro in range(2):
            lo, hi = program.offsets[micro], program.offsets[micro] + program.counts[micro]
            kind_in = "grad" if program.stage == 0 else "act"
            got = sorted(
                (t.lo, t.hi)
                for t in compiled.transfers
                if t.dst == address and t.micro == micro and t.grad == (kind_in == "grad")
            )
            covered = list(itertools.chain.from_iterable(range(a, b) for a, b in got))
            assert covered == list(range(lo, hi)), (address, micro, got)  # every sample exactly once


def test_gradient_groups_are_per_shard() -> None:
    stage = Stage(0, 4, ("n0/0", "n0/1", "n0/2", "n0/3"), (0.5, 0.5), tensor_parallel=2)
    plan = Plan(global_batch=4, pipelines=[Pipeline(4, (2, 2), (stage,))])
    groups = compile_plan(plan, 4).groups
    assert [(g.devices, g.tp_rank, g.tensor_parallel) for g in groups] == [
        (("n0/0", "n0/2"), 0, 2),
        (("n0/1", "n0/3"), 1, 2),
    ]

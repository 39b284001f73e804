"""Shared (tied) parameters: listed once in a profile (``shared``), a copy on every stage holding one
of their blocks, their gradient summed over every holder at the step (DESIGN.md, "Shared (tied)
parameters"; the runtime's side: hetplan.runtime.parallel.tied). The allocator peaks of a real run
are checked in tests/runtime/test_memory_terms.py (``test_a_tied_head_is_held_by_each_stage_holding_an_end``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import make_cluster, make_profile
from test_replicas import _same

from hetplan.contracts.model_profile import SharedParams, parse_profile
from hetplan.contracts.plan import Pipeline, Plan, Stage, check_plan
from hetplan.errors import HetplanError
from hetplan.schedule.compile import compile_plan
from hetplan.simulate import simulate
from hetplan.simulate.costs import CostModel
from hetplan.simulate.memory import plan_memory
from hetplan.solve import PlanOptions, plan_training

A100 = "A100-80GB"
TABLE = 10_000_000  # a tied table's parameters (fp32: 40 MB)


def _profile(n: int = 4, *, table: int = TABLE) -> tuple:
    """(tied, the same blocks without the shared entry): blocks 0 and n - 1 hold the table."""
    plain = make_profile(n, times={A100: (1.0, 2.0)}, params=1_000_000, activation_bytes=1e6, output_bytes=1e6)
    tied = replace(plain, shared=[SharedParams("table", table, float(4 * table), (0, n - 1))])
    return tied, plain


def _stage(start: int, end: int, *devices: str, tp: int = 1) -> Stage:
    replicas = len(devices) // tp
    return Stage(start, end, devices, tuple(1.0 / replicas for _ in range(replicas)), tensor_parallel=tp)


def _plan(*pipelines: tuple[Stage, ...], zero: int = 0, sync: str = "allreduce") -> Plan:
    return Plan(
        4 * len(pipelines),
        [Pipeline(4, (2, 2), stages) for stages in pipelines],
        optimizer="adam",
        zero=zero,
        sync=sync,
    )


# ------------------------------------------------------------------------------------- the contract
def test_a_shared_entry_reads_back_as_written() -> None:
    tied, _ = _profile()
    tied.shared[0] = replace(tied.shared[0], tensor_parallel={2: (TABLE // 2, 2.0 * TABLE)})
    data = tied.to_dict()
    assert data["shared"] == [
        {
            "name": "table",
            "params": TABLE,
            "param_bytes": 4.0 * TABLE,
            "blocks": [0, 3],
            "tensor_parallel": {2: {"params": TABLE // 2, "param_bytes": 2.0 * TABLE}},
        }
    ]
    assert parse_profile(data).shared == tied.shared
    assert tied.total_params == 4 * 1_000_000 + TABLE
    # DESIGN.md's example: param_bytes defaults to params at the profile's dtype, blocks in any order
    data["shared"] = [{"name": "embedding.weight", "params": 6433792, "blocks": [3, 0]}]
    (entry,) = parse_profile(data).shared
    assert (entry.param_bytes, entry.blocks, entry.at(2)) == (4.0 * 6433792, (0, 3), (6433792, 4.0 * 6433792))


@pytest.mark.parametrize(
    ("entry", "field", "message"),
    [
        ({"name": "t", "params": 5, "blocks": [0]}, "shared[0].blocks", "expected two or more distinct block indices"),
        ({"name": "t", "params": 5, "blocks": [0, 0]}, "shared[0].blocks", "expected two or more distinct"),
        ({"name": "t", "params": 5, "blocks": [0, 9]}, "shared[0].blocks", "block 9 does not exist"),
        ({"name": "t", "params": -1, "blocks": [0, 1]}, "shared[0].params", ""),
        ({"name": "t", "params": 5, "blocks": [0, 1], "tied": 1}, "shared[0]", "tied"),
        (
            {"name": "t", "params": 5, "blocks": [0, 1], "tensor_parallel": {2: {"params": 6}}},
            "shared[0].tensor_parallel.2.params",
            "cannot hold more than the entry's 5",
        ),
        (
            {"name": "t", "params": 5, "blocks": [0, 1], "tensor_parallel": {1: {"params": 5}}},
            "shared[0].tensor_parallel",
            "integers >= 2",
        ),
    ],
)
def test_a_bad_shared_entry_names_its_field(entry, field: str, message: str) -> None:
    data = _profile()[0].to_dict()
    data["shared"] = [entry]
    with pytest.raises(HetplanError) as err:
        parse_profile(data, file="p.yaml")
    assert err.value.file == "p.yaml"
    assert err.value.field.startswith(field)
    assert message in str(err.value)


def test_two_entries_of_one_name_are_refused() -> None:
    data = _profile()[0].to_dict()
    data["shared"] = [{"name": "t", "params": 5, "blocks": [0, 1]}, {"name": "t", "params": 5, "blocks": [2, 3]}]
    with pytest.raises(HetplanError, match="duplicate shared parameter name 't'"):
        parse_profile(data)


# ------------------------------------------------------------------------------------------ memory
def test_each_stage_holding_a_holder_block_keeps_one_copy() -> None:
    """Weights, gradient and Adam state of the table (4 + 4 + 8 bytes a parameter) on the
    embedding's stage and on the head's; a stage holding both ends keeps one; a middle stage none."""
    tied, plain = _profile(6)
    cluster = make_cluster([("n0", [(A100, 4)])])
    for plan, copies in (
        (_plan((_stage(0, 2, "n0/0"), _stage(2, 4, "n0/1"), _stage(4, 6, "n0/2"))), {"n0/0": 1, "n0/1": 0, "n0/2": 1}),
        (_plan((_stage(0, 6, "n0/0"),)), {"n0/0": 1}),
    ):
        with_copy = plan_memory(compile_plan(plan, 6), tied, cluster, optimizer="adam", plan=plan)
        without = plan_memory(compile_plan(plan, 6), plain, cluster, optimizer="adam", plan=plan)
        for address, n in copies.items():
            assert with_copy[address].weights - without[address].weights == 4.0 * TABLE * n
            assert with_copy[address].optimizer - without[address].optimizer == 8.0 * TABLE * n
            assert with_copy[address].tensor_bytes - without[address].tensor_bytes == pytest.approx(16.0 * TABLE * n)


def test_a_degree_2_holder_keeps_its_members_share() -> None:
    tied, _ = _profile(2)
    tied.shared[0] = replace(tied.shared[0], tensor_parallel={2: (TABLE // 2, 2.0 * TABLE)})
    tied.blocks[:] = [replace(b, tensor_parallel={2: _half(b)}) for b in tied.blocks]
    plan = _plan((_stage(0, 2, "n0/0", "n0/1", tp=2),))
    assert tied.shared_held(0, 2, 2) == (TABLE // 2, 2.0 * TABLE)
    memory = plan_memory(compile_plan(plan, 2), tied, make_cluster([("n0", [(A100, 2)])]), optimizer="adam", plan=plan)
    assert memory["n0/0"].weights == 2 * 4.0 * 500_000 + 2.0 * TABLE


def _half(block, speed: float = 1.0):
    """The block at degree 2: half its parameters and activations, its times divided by ``speed``."""
    from hetplan.contracts.model_profile import TensorParallel, Timing

    times = {d: {m: Timing(t.fwd / speed, t.bwd / speed) for m, t in by.items()} for d, by in block.times.items()}
    return TensorParallel(
        params=block.params // 2,
        param_bytes=block.param_bytes / 2,
        activation_bytes=block.activation_bytes / 2,
        allreduce_bytes=1e3,
        times=times,
    )


# ------------------------------------------------------------------------------------------- time
def test_the_tied_gradient_is_summed_over_its_holders_before_either_steps() -> None:
    """One all-reduce of the table's gradient between the embedding's and the head's device, after
    both backwards (and their gradient groups), before both steps: on a slow link it is on the
    critical path for exactly its ring time."""
    tied, plain = _profile()
    cluster = make_cluster([("n0", [(A100, 2)])], intra="10GB/s")
    plan = _plan((_stage(0, 2, "n0/0"), _stage(2, 4, "n0/1")))
    result = simulate(plan, tied, cluster, timeline=True)
    devices = [cluster.device("n0/0"), cluster.device("n0/1")]
    seconds = CostModel(tied, cluster, optimizer="adam").allreduce(4.0 * TABLE, devices)
    assert seconds > 1e-3
    rows = [r for r in result.timeline if "tied" in r[4]]
    assert sorted(r[0] for r in rows) == ["n0/0", "n0/1"]
    lo, hi = rows[0][2], rows[0][3]
    assert hi - lo == pytest.approx(seconds)
    for address in ("n0/0", "n0/1"):
        backwards = [r for r in result.timeline if r[0] == address and r[1] == "B"]
        (step,) = [r for r in result.timeline if r[0] == address and r[1] == "step"]
        assert max(r[3] for r in backwards) <= lo and step[2] >= hi
    assert dict(result.critical_path)["tied all-reduce (table) of group 2"] == pytest.approx(seconds)
    untied = simulate(plan, plain, cluster)
    assert result.iteration_s > untied.iteration_s + seconds


def test_pipelines_holding_a_tied_table_fold_to_the_same_result(monkeypatch) -> None:
    """The tied group spans every holder of every pipeline, like a gradient group: the pipelines
    that run alike are still simulated once, with the same figures as the full run."""
    tied, _ = _profile()
    cluster = make_cluster([("n0", [(A100, 4)])], intra="10GB/s")
    plan = _plan(
        (_stage(0, 2, "n0/0"), _stage(2, 4, "n0/1")),
        (_stage(0, 2, "n0/2"), _stage(2, 4, "n0/3")),
    )
    assert _same(plan, tied, cluster, monkeypatch)


# ------------------------------------------------------------------------------ what is refused
@pytest.mark.parametrize(
    ("plan", "field", "message"),
    [
        (
            _plan((_stage(0, 4, "n0/0"),), (_stage(0, 4, "n0/1"),), zero=1),
            "zero",
            "ZeRO-1 does not support that yet",
        ),
        (_plan((_stage(0, 4, "n0/0"),), sync="topk"), "sync", "sync topk does not sum their gradients"),
        (
            _plan((_stage(0, 2, "n0/0", "n0/1", tp=2), _stage(2, 4, "n0/2"))),
            "pipelines",
            "held at tensor-parallel degrees 1, 2: every holder needs one degree and one cut",
        ),
        (
            _plan((_stage(0, 2, "n0/0", "n0/1", tp=2), _stage(2, 4, "n0/2", "n0/3", tp=2))),
            "pipelines",
            "tensor parallelism supports that for zoo models only yet",
        ),
    ],
)
def test_what_the_runtime_cannot_do_with_ties_is_refused_before_timing(plan, field: str, message: str) -> None:
    tied, _ = _profile()
    tied.blocks[:] = [replace(b, tensor_parallel={2: _half(b)}) for b in tied.blocks]
    if "zoo models" not in message:  # the zoo GPT's tied head runs under TP; other models' ties do not
        tied.model = {"family": "gpt", "config": {}}
    with pytest.raises(HetplanError) as err:
        check_plan(plan, make_cluster([("n0", [(A100, 4)])]), tied)
    assert err.value.field == field
    assert message in str(err.value)


def test_the_planner_never_shards_a_tied_models_optimizer_state() -> None:
    """Memory tight enough that ZeRO-1 would be tried: the plan keeps it off, every holder fits."""
    tied, _ = _profile(table=2_000_000_000)
    cluster = make_cluster([("n0", [(A100, 4)])])
    result = plan_training(tied, cluster, PlanOptions(global_batch=8, micro_batch_sizes=(1, 2)))
    assert result.plan.zero == 0
    check_plan(result.plan, cluster, tied)
    holders = len(result.plan.pipelines) > 1 or any(s.replicated for p in result.plan.pipelines for s in p.stages)
    assert holders  # so ZeRO-1 had something to shard, and the plan says why it is off
    assert "ties parameters (table)" in result.explanations["zero"]["why"]
    for baseline in result.baselines.values():
        assert baseline is None or baseline.plan.zero == 0
    with pytest.raises(HetplanError, match="sync topk does not sum their gradients") as err:
        plan_training(tied, cluster, PlanOptions(global_batch=8, sync="topk"))
    assert err.value.field == "--sync"


def test_a_tied_model_from_outside_the_zoo_is_planned_without_tensor_parallelism() -> None:
    """The runtime cuts only the zoo GPT's tied table; another model's ties under TP are refused
    there, so the planner offers it degree 1 only (its profile's degrees left aside)."""
    tied, _ = _profile()
    tied.blocks[:] = [replace(b, tensor_parallel={2: _half(b, speed=1.9)}) for b in tied.blocks]
    cluster = make_cluster([("n0", [(A100, 4)])])
    options = PlanOptions(global_batch=2, micro_batch_sizes=(1,))
    zoo = replace(tied, model={"family": "gpt", "config": {}})  # the same figures where TP may run: it wins
    assert any(s.tensor_parallel == 2 for p in plan_training(zoo, cluster, options).plan.pipelines for s in p.stages)
    result = plan_training(tied, cluster, options)
    assert all(s.tensor_parallel == 1 for p in result.plan.pipelines for s in p.stages)
    check_plan(result.plan, cluster, tied)
    # compare's baselines, found afresh for a plan file without them, keep to degree 1 too
    from hetplan.solve.compare import compare_rows

    rows = compare_rows(replace(result.plan, baselines={}), tied, cluster)
    assert rows[0]["name"] == "hetplan" and len(rows) > 1


def test_a_tied_gpt_is_planned_with_both_ends_at_one_degree() -> None:
    """Both ends of a GPT-2 style tied head, on a mixed cluster where tensor parallelism is on
    offer: whatever the search and its refinement choose, the embedding and the head share a degree
    and the plan passes the contract check (it was refused before the search knew of ties)."""
    from pathlib import Path

    from hetplan.contracts import load_catalog
    from hetplan.contracts.cluster import load_cluster
    from hetplan.profile.analytic import analytic_profile

    catalog = load_catalog()
    config = {"layers": 2, "hidden": 256, "heads": 4, "seq": 16, "vocab": 1024, "head": "tied"}
    profile = analytic_profile("gpt", config, devices=[catalog.get(A100), catalog.get("V100-16GB")], tp_degrees=(1, 2))
    cluster = load_cluster(Path(__file__).parents[2] / "profiles" / "clusters" / "mixed-a100-v100.yaml")
    result = plan_training(profile, cluster, PlanOptions(global_batch=64))
    check_plan(result.plan, cluster, profile)
    ends = {s.tensor_parallel for p in result.plan.pipelines for s in p.stages if s.start == 0 or s.end == 6}
    assert len(ends) == 1


def test_the_tied_all_reduce_waits_for_the_holders_sends() -> None:
    """The runtime's order at the step: a holder's in-flight sends, its gradient groups, then the
    tied all-reduce. Holders in stages 1 and 2 of three, stage 1's last gradient send to stage 0 on
    a slow network link: the all-reduce starts only when that send has ended (it ran beside it)."""
    profile = make_profile(3, times={A100: (0.01, 0.02)}, params=1000, activation_bytes=1e6, output_bytes=2e9)
    profile = replace(profile, shared=[SharedParams("t", 300_000_000, 1.2e9, (1, 2))])
    cluster = make_cluster([("n0", [(A100, 1)]), ("n1", [(A100, 1)]), ("n2", [(A100, 1)])], inter="10Gbps")
    stages = tuple(Stage(i, i + 1, (f"n{i}/0",), (1.0,)) for i in range(3))
    plan = Plan(2, [Pipeline(2, (1, 1), stages)], optimizer="sgd")
    timeline = simulate(plan, profile, cluster, timeline=True).timeline
    sends = [r for r in timeline if r[0] == "n1/0" and r[1] == "send" and "n1/0 -> n0/0" in r[4]]
    (tied,) = [r for r in timeline if r[0] == "n1/0" and "tied" in r[4]]
    assert sends and tied[2] >= max(r[3] for r in sends)


def test_the_searchs_estimate_prices_the_tied_all_reduce() -> None:
    """A two-stage pipeline holding the two ends of a tied table: the search's closed form adds the
    table's all-reduce between the two devices (it runs after the backward, overlapping nothing)."""
    from hetplan.solve.search import _Search
    from hetplan.solve.structures import candidate_structures

    tied, plain = _profile()
    cluster = make_cluster([("n0", [(A100, 2)])], intra="10GB/s")
    options = PlanOptions(global_batch=4, micro_batch_sizes=(2,), baselines=False)
    structure = next(
        s for s in candidate_structures(cluster, n_blocks=4) if len(s.pipelines) == 1 and len(s.pipelines[0]) == 2
    )
    (with_tie,) = _Search(tied, cluster, options).found(structure)
    (without,) = _Search(plain, cluster, options).found(structure)
    assert [p.cuts for p in with_tie.parts] == [p.cuts for p in without.parts]
    devices = [cluster.device("n0/0"), cluster.device("n0/1")]
    seconds = CostModel(tied, cluster, optimizer="adam").allreduce(4.0 * TABLE, devices)
    assert with_tie.estimate - without.estimate == pytest.approx(seconds)

"""Tensor-parallel stages on gloo, multi-process on this CPU: one step equals a single-process step.

Every plan trains a tiny GPT (2 layers, hidden 32, 4 heads, seq 8) for 3 steps with real ranks; the
losses and every parameter of the saved checkpoint (full blocks, gathered from the shards) must match
the single-process reference within 1e-5. A checkpoint saved at one degree resumes at another with
the next loss of the uninterrupted run.
"""

from __future__ import annotations

import pytest
from builders import make_cluster, zoo_profile
from reference_checks import assert_run_equals_reference

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.rank_config import load_rank_config
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.runtime.checkpoint import read_block
from hetplan.runtime.launcher import launch_local
from hetplan.runtime.reference import train_reference

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 4, "seq": 8, "vocab": 31}}
STEPS = 3


def _stage(start: int, end: int, *devices: str, tp: int = 1, shares=None, recompute: str = "none") -> Stage:
    replicas = len(devices) // tp
    return Stage(start, end, devices, shares or (1.0 / replicas,) * replicas, tensor_parallel=tp, recompute=recompute)


def _plan(pipelines: list[Pipeline], optimizer: str = "adam") -> Plan:
    return Plan(global_batch=sum(p.batch for p in pipelines), pipelines=pipelines, schedule="1f1b", optimizer=optimizer)


def _run(tmp_path, plan: Plan, *, steps: int = STEPS, clip: float | None = None, **kw):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cluster = make_cluster([("n0", [("cpu", 8)])])
    config = build_rank_config(
        plan, zoo_profile(GPT), cluster, seed=7, backend="gloo", timeout_s=60, clip_grad_norm=clip
    )
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    return launch_local(path, steps=steps, **kw), config, path


def _check(tmp_path, plan: Plan, clip: float | None = None) -> list[dict]:
    result, config, _ = _run(tmp_path, plan, save=tmp_path / "ckpt", clip=clip)
    history: list[dict] = []
    losses, blocks = train_reference(
        GPT,
        global_batch=plan.global_batch,
        optimizer=plan.optimizer,
        lr=config["training"]["lr"],
        seed=7,
        steps=STEPS,
        clip_grad_norm=clip,
        history=history,
    )
    return assert_run_equals_reference(result.records, losses, history, blocks, tmp_path / "ckpt")


def test_the_rank_config_carries_tensor_parallel_recompute_and_zero(tmp_path) -> None:
    plan = _plan([Pipeline(4, (2, 2), (_stage(0, 3, "n0/0", "n0/1", tp=2, recompute="selective"),))])
    plan.zero = 1
    config = build_rank_config(plan, zoo_profile(GPT), make_cluster([("n0", [("cpu", 2)])]), seed=7)
    write_yaml(config, tmp_path / "rc.yaml")
    read = load_rank_config(tmp_path / "rc.yaml")
    stage = read.plan.pipelines[0].stages[0]
    assert (stage.tensor_parallel, stage.recompute, read.plan.zero) == (2, "selective", 1)


def test_a_tp2_stage_with_full_recompute_then_a_tp1_stage_with_selective_recompute(tmp_path) -> None:
    stages = (_stage(0, 3, "n0/0", "n0/1", tp=2, recompute="full"), _stage(3, 6, "n0/2", recompute="selective"))
    _check(tmp_path, _plan([Pipeline(8, (4, 4), stages)]))


def test_a_tp1_stage_with_full_recompute_then_a_tp4_stage_with_selective_recompute(tmp_path) -> None:
    four = _stage(3, 6, "n0/1", "n0/2", "n0/3", "n0/4", tp=4, recompute="selective")
    _check(tmp_path, _plan([Pipeline(8, (4, 4), (_stage(0, 3, "n0/0", recompute="full"), four))], optimizer="momentum"))


def test_replicas_of_tp2_with_unequal_shares_in_pipelines_cut_differently(tmp_path) -> None:
    """Pipeline 0: two TP 2 replicas taking 60 % and 40 % of each micro-batch, then a TP 2 stage;
    pipeline 1: one TP 2 stage of the whole model. Gradient groups per shard span both."""
    replicas = _stage(0, 3, "n0/0", "n0/1", "n0/2", "n0/3", tp=2, shares=(0.6, 0.4))
    plan = _plan(
        [
            Pipeline(5, (2, 3), (replicas, _stage(3, 6, "n0/4", "n0/5", tp=2))),
            Pipeline(3, (3,), (_stage(0, 6, "n0/6", "n0/7", tp=2),)),
        ],
        optimizer="sgd",
    )
    _check(tmp_path, plan)


def test_zero1_with_tensor_parallel_replicas_and_global_norm_clipping(tmp_path) -> None:
    """Two pipelines of one TP 2 stage each, ``zero: 1``: each shard group's optimizer state is
    sharded over its two holders; the clipped steps equal the one-process run's."""
    plan = _plan(
        [
            Pipeline(4, (2, 2), (_stage(0, 6, "n0/0", "n0/1", tp=2),)),
            Pipeline(4, (4,), (_stage(0, 6, "n0/2", "n0/3", tp=2),)),
        ]
    )
    plan.zero = 1
    records = _check(tmp_path, plan, clip=0.5)
    assert any(r["clipped"] for r in records)


def test_a_checkpoint_saved_at_tp2_resumes_at_tp1_and_back_at_tp2(tmp_path) -> None:
    """Saved at TP 2 after 2 steps, resumed at TP 1 for step 3 (saved again), resumed for step 4 by
    two TP 2 pipelines under ZeRO-1 (each member cuts its shard of the full saved weights and Adam
    state, each ZeRO holder its part of that): each next loss is the uninterrupted run's."""
    tp2 = _plan([Pipeline(8, (4, 4), (_stage(0, 2, "n0/0"), _stage(2, 6, "n0/1", "n0/2", tp=2)))])
    tp1 = _plan([Pipeline(8, (4, 4), (_stage(0, 2, "n0/0"), _stage(2, 6, "n0/1")))])
    zero = _plan(
        [
            Pipeline(4, (4,), (_stage(0, 6, "n0/0", "n0/1", tp=2),)),
            Pipeline(4, (4,), (_stage(0, 6, "n0/2", "n0/3", tp=2),)),
        ]
    )
    zero.zero = 1
    _, config, _ = _run(tmp_path / "a", tp2, steps=2, save=tmp_path / "ckpt-a")
    one, _, _ = _run(tmp_path / "b", tp1, steps=1, resume=tmp_path / "ckpt-a", save=tmp_path / "ckpt-b")
    two, _, _ = _run(tmp_path / "c", zero, steps=1, resume=tmp_path / "ckpt-b")
    losses, _ = train_reference(GPT, global_batch=8, optimizer="adam", lr=config["training"]["lr"], seed=7, steps=4)
    assert [r["step"] for r in (one.records[0], two.records[0])] == [2, 3]
    assert one.records[0]["loss"] == pytest.approx(losses[2], abs=1e-5)
    assert two.records[0]["loss"] == pytest.approx(losses[3], abs=1e-5)
    assert read_block(tmp_path / "ckpt-a", 3).params["qkv.weight"].shape == (96, 32)  # whole, not a shard


@pytest.mark.parametrize(("ts", "tr"), [(2, 2), (2, 1)], ids=["tp2-tp2", "tp2-tp1"])
def test_split_boundary_sends_train_as_the_reference(tmp_path, ts: int, tr: int) -> None:
    """Two stages at TP 2 (and TP 2 then 1): each member sends its chunk of the boundary activation
    (and gets its chunk of the gradient back), the receiving group all-gathers (schedule/boundary.py).
    Same losses and weights as one process."""
    first = tuple(f"n0/{i}" for i in range(ts))
    second = tuple(f"n0/{ts + i}" for i in range(tr))
    plan = _plan([Pipeline(6, (3, 3), (_stage(0, 3, *first, tp=ts), _stage(3, 6, *second, tp=tr)))])
    _check(tmp_path, plan)

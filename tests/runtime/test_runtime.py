"""The runtime on gloo, multi-process on this CPU: one step equals a single-process step.

Each plan is trained for 3 steps by real ranks (one process per device); the losses and every
parameter afterwards must match the single-process reference within 1e-5 (float32).
"""

from __future__ import annotations

import pytest
import torch
from builders import make_cluster, zoo_profile

from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.runtime.checkpoint import read_block
from hetplan.runtime.launcher import launch_local
from hetplan.runtime.reference import train_reference
from hetplan.runtime.validate import validate_programs
from hetplan.schedule.compile import compile_plan

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
STEPS = 3


def _profile(model: dict) -> ModelProfile:
    return zoo_profile(model)


def _stage(start: int, end: int, *devices: str, shares: tuple[float, ...] | None = None) -> Stage:
    return Stage(start, end, devices, shares or tuple(1.0 / len(devices) for _ in devices))


def _run(tmp_path, plan: Plan, model: dict = GPT, *, steps: int = STEPS, lr: float | None = None, **kw):
    profile = _profile(model)
    cluster = make_cluster([("n0", [("cpu", 4)])])
    config = build_rank_config(plan, profile, cluster, seed=7, lr=lr, backend="gloo", timeout_s=kw.pop("timeout", 60))
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    return launch_local(path, steps=steps, **kw), config


def _check_against_reference(tmp_path, plan: Plan, model: dict = GPT) -> None:
    result, config = _run(tmp_path, plan, model, save=tmp_path / "ckpt")
    losses, blocks = train_reference(
        model,
        global_batch=plan.global_batch,
        optimizer=plan.optimizer,
        lr=config["training"]["lr"],
        seed=7,
        steps=STEPS,
    )
    measured = [r["loss"] for r in result.records if r["rank"] == 0]
    assert measured == pytest.approx(losses, abs=1e-5)
    for i, block in enumerate(blocks):
        saved = read_block(tmp_path / "ckpt", i).params
        for name, value in block.state_dict().items():
            torch.testing.assert_close(saved[name], value.detach(), atol=1e-5, rtol=0)


def _plan(pipelines: list[Pipeline], *, schedule: str = "1f1b", optimizer: str = "sgd") -> Plan:
    return Plan(
        global_batch=sum(p.batch for p in pipelines), pipelines=pipelines, schedule=schedule, optimizer=optimizer
    )


def test_one_stage(tmp_path) -> None:
    _check_against_reference(tmp_path, _plan([Pipeline(8, (4, 4), (_stage(0, 6, "n0/0"),))]))


def test_two_stages_unequal_micro_batches_adam(tmp_path) -> None:
    plan = _plan([Pipeline(8, (2, 2, 4), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))], optimizer="adam")
    _check_against_reference(tmp_path, plan)


def test_four_stages_gpipe(tmp_path) -> None:
    stages = (_stage(0, 1, "n0/0"), _stage(1, 3, "n0/1"), _stage(3, 5, "n0/2"), _stage(5, 6, "n0/3"))
    _check_against_reference(tmp_path, _plan([Pipeline(8, (2, 2, 2, 2), stages)], schedule="gpipe"))


def test_replicated_stage_with_resharding(tmp_path) -> None:
    stages = (_stage(0, 2, "n0/0", "n0/1", shares=(0.75, 0.25)), _stage(2, 6, "n0/2"))
    _check_against_reference(tmp_path, _plan([Pipeline(8, (3, 5), stages)], optimizer="momentum"))


def test_pipelines_cut_differently_with_unequal_shares(tmp_path) -> None:
    plan = _plan(
        [
            Pipeline(5, (1, 2, 2), (_stage(0, 2, "n0/0"), _stage(2, 6, "n0/1"))),
            Pipeline(3, (3,), (_stage(0, 4, "n0/2"), _stage(4, 6, "n0/3"))),
        ]
    )
    _check_against_reference(tmp_path, plan)


def test_the_blocking_all_reduce_kept_for_benchmarks_gives_the_same_training(tmp_path) -> None:
    plan = _plan(
        [
            Pipeline(5, (1, 2, 2), (_stage(0, 2, "n0/0"), _stage(2, 6, "n0/1"))),
            Pipeline(3, (3,), (_stage(0, 4, "n0/2"), _stage(4, 6, "n0/3"))),
        ]
    )
    result, config = _run(tmp_path, plan, blocking_allreduce=True)
    losses, _ = train_reference(GPT, global_batch=8, optimizer="sgd", lr=config["training"]["lr"], seed=7, steps=STEPS)
    assert [r["loss"] for r in result.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)


def test_checkpoint_resumes_under_a_different_plan(tmp_path) -> None:
    first = _plan([Pipeline(8, (4, 4), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))], optimizer="adam")
    second = _plan(
        [Pipeline(4, (2, 2), (_stage(0, 5, "n0/0"), _stage(5, 6, "n0/1"))), Pipeline(4, (4,), (_stage(0, 6, "n0/2"),))],
        optimizer="adam",
    )
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _run(tmp_path / "a", first, steps=2, save=tmp_path / "ckpt")
    resumed, config = _run(tmp_path / "b", second, steps=1, resume=tmp_path / "ckpt")
    losses, _ = train_reference(GPT, global_batch=8, optimizer="adam", lr=config["training"]["lr"], seed=7, steps=3)
    assert resumed.records[0]["step"] == 2
    assert resumed.records[0]["loss"] == pytest.approx(losses[2], abs=1e-5)


def test_a_killed_rank_stops_every_rank_with_a_message(tmp_path) -> None:
    plan = _plan([Pipeline(8, (4, 4), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))])
    with pytest.raises(HetplanError) as info:
        _run(tmp_path, plan, steps=100_000, timeout=15, kill_rank_after=(1, 8.0))
    message = str(info.value)
    assert "rank 1 (n0/1) died" in message
    assert "waiting on" in message and "step" in message  # the survivor names its step and action


def test_the_validator_refuses_a_schedule_that_would_deadlock() -> None:
    plan = _plan([Pipeline(2, (1, 1), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))])
    programs = {a: list(p.actions) for a, p in compile_plan(plan, 6).programs.items()}
    validate_programs(programs)  # the compiled schedule is fine
    # stage 0 waits for micro-batch 0's gradient (and runs its backward) before sending its
    # activation: both wait forever
    acts = programs["n0/0"]
    send = next(i for i, a in enumerate(acts) if a.kind.value == "SA" and a.micro == 0)
    backward = next(i for i, a in enumerate(acts) if a.kind.value == "B" and a.micro == 0)
    moved = acts[send]
    reordered = [a for i, a in enumerate(acts) if i != send]
    reordered.insert(reordered.index(acts[backward]) + 1, moved)
    with pytest.raises(HetplanError, match="deadlock"):
        validate_programs({**programs, "n0/0": reordered}, semantics="gloo")
    # under NCCL too (there the pair's sends and receives are also posted in different orders)
    with pytest.raises(HetplanError, match=r"same order|deadlock"):
        validate_programs({**programs, "n0/0": reordered})
    # a backward before its forward is refused too
    with pytest.raises(HetplanError, match="before its forward"):
        validate_programs({**programs, "n0/1": list(reversed(programs["n0/1"]))})


def test_a_character_level_language_model_on_a_text_file(tmp_path) -> None:
    text = tmp_path / "book.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    plan = _plan([Pipeline(8, (4, 4), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))])
    profile = _profile(GPT)
    cluster = make_cluster([("n0", [("cpu", 2)])])
    config = build_rank_config(plan, profile, cluster, seed=7, backend="gloo", data=str(text))
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    result = launch_local(path, steps=STEPS)
    losses, _ = train_reference(
        GPT, global_batch=8, optimizer="sgd", lr=config["training"]["lr"], seed=7, steps=STEPS, data=str(text)
    )
    assert [r["loss"] for r in result.records if r["rank"] == 0] == pytest.approx(losses, abs=1e-5)


def test_a_text_with_more_characters_than_the_vocabulary_is_refused(tmp_path) -> None:
    from hetplan.runtime.textdata import TextData

    text = tmp_path / "wide.txt"
    text.write_text("".join(chr(c) for c in range(40, 120)) * 3)
    with pytest.raises(HetplanError, match="--vocab 80"):
        TextData(text, seq=8, vocab=31)


# -- mixed precision ---------------------------------------------------------------------------------
#: fp16/bf16 runs add up per-micro-batch gradients in fp32 where the reference takes one backward over
#: the whole batch in half precision, so they agree to the dtype's precision, not bit for bit:
#: losses within 1e-3, and every weight within two units in the last place of the dtype (relative).
MIXED_LOSS_ATOL = 1e-3
MIXED_PARAM_RTOL = {"bf16": 2 * 2.0**-8, "fp16": 2 * 2.0**-11}


def _check_mixed_against_reference(tmp_path, plan: Plan, dtype: str) -> list[dict]:
    plan.dtype = dtype
    profile = _profile(GPT)
    profile.dtype = dtype
    cluster = make_cluster([("n0", [("cpu", 4)])])
    config = build_rank_config(plan, profile, cluster, seed=7, backend="gloo", timeout_s=60)
    assert config["training"]["dtype"] == dtype
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    result = launch_local(path, steps=STEPS, save=tmp_path / "ckpt")
    losses, blocks = train_reference(
        GPT,
        global_batch=plan.global_batch,
        optimizer=plan.optimizer,
        lr=config["training"]["lr"],
        seed=7,
        steps=STEPS,
        dtype=dtype,
    )
    measured = [r["loss"] for r in result.records if r["rank"] == 0]
    assert measured == pytest.approx(losses, abs=MIXED_LOSS_ATOL)
    rtol = MIXED_PARAM_RTOL[dtype]
    for i, block in enumerate(blocks):
        saved = read_block(tmp_path / "ckpt", i)
        for name, value in block.state_dict().items():
            assert saved.params[name].dtype == value.dtype
            if value.is_floating_point():
                torch.testing.assert_close(saved.params[name], value.detach(), rtol=rtol, atol=rtol)
        assert saved.master and all(m.dtype == torch.float32 for m in saved.master.values())  # fp32 master weights
    return result.records


def test_bf16_two_stages_unequal_micro_batches_match_a_bf16_single_process_run(tmp_path) -> None:
    plan = _plan([Pipeline(8, (2, 2, 4), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))], optimizer="momentum")
    records = _check_mixed_against_reference(tmp_path, plan, "bf16")
    assert all(r["dtype"] == "bf16" for r in records)


def test_fp16_replicas_and_pipelines_cut_differently_match_an_fp16_single_process_run(tmp_path) -> None:
    plan = _plan(
        [
            Pipeline(5, (2, 3), (_stage(0, 2, "n0/0", "n0/1", shares=(0.6, 0.4)), _stage(2, 6, "n0/2"))),
            Pipeline(3, (3,), (_stage(0, 6, "n0/3"),)),
        ]
    )
    records = _check_mixed_against_reference(tmp_path, plan, "fp16")
    # dynamic loss scaling: the scale is logged, and no step of this small model overflowed
    assert all(r["loss_scale"] == 2.0**16 and r["skipped_step"] is False for r in records)


def test_fp16_loss_scaling_skips_an_overflowing_step_on_every_rank_and_halves_the_scale() -> None:
    from hetplan.runtime.precision import Precision

    params = [torch.nn.Parameter(torch.ones(3, dtype=torch.float16))]
    precision = Precision("fp16", params, optimizer="sgd", lr=0.1)
    precision.main_grads[0].fill_(float("inf"))
    assert precision.nonfinite() == 1
    # another rank's overflow (the all-reduced count) skips this rank's step too
    precision.main_grads[0].fill_(1.0)
    assert precision.step(nonfinite_anywhere=1) is False
    assert params[0].tolist() == [1.0, 1.0, 1.0] and precision.scaler.scale == 2.0**15
    precision.main_grads[0].fill_(2.0**15)  # a scaled gradient of 1.0
    assert precision.step(nonfinite_anywhere=0) is True
    assert params[0].tolist() == pytest.approx([0.9, 0.9, 0.9], abs=1e-3)

"""Exports of plans with tensor-parallel stages, recomputation and ZeRO-1: Megatron-LM says all
three where the plan uses one TP degree; mixed degrees, and runtimes without these settings, say
what they drop."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from conftest import pipeline

from hetplan.contracts.model_profile import TensorParallel, load_profile
from hetplan.contracts.plan import check_plan, load_plan, load_plan_inputs
from hetplan.export import deepspeed, megatron
from hetplan.export.structure import uniform_structure
from hetplan.simulate import simulate


def _tp_stage(start: int, end: int, *devices: str, recompute: str = "none") -> dict:
    out = {"blocks": [start, end], "devices": list(devices), "tensor_parallel": 2}
    if recompute != "none":
        out["recompute"] = recompute
    return out


def _with_embedding_split(inputs: Path) -> str:
    """The fixture's GPT with degree 2 on its embedding and head too (as Megatron splits them)."""
    profile = load_profile(inputs / "gpt.yaml")
    blocks = list(profile.blocks)
    for i in (0, len(blocks) - 1):
        b = blocks[i]
        data = TensorParallel(
            params=b.params // 2,
            param_bytes=b.param_bytes / 2,
            activation_bytes=b.activation_bytes / 2,
            allreduce_bytes=b.output_bytes,
            times={t: dict(points) for t, points in b.times.items()},
        )
        blocks[i] = replace(b, tensor_parallel={**b.tensor_parallel, 2: data})
    replace(profile, blocks=blocks).save(inputs / "gpt-tp.yaml")
    return "gpt-tp.yaml"


def test_megatron_exports_one_tp_degree_recompute_and_zero(inputs: Path, write_plan) -> None:
    name = _with_embedding_split(inputs)
    path = write_plan(
        "tp",
        profile=name,
        zero=1,
        pipelines=[
            pipeline(
                16,
                [4, 4, 4, 4],
                _tp_stage(0, 7, "n0/0", "n0/1", recompute="full"),
                _tp_stage(7, 14, "n1/0", "n1/1", recompute="full"),
            )
        ],
    )
    plan = load_plan(path)
    profile, cluster = load_plan_inputs(plan)
    check_plan(plan, cluster, profile)
    u = uniform_structure(plan, profile, cluster, megatron.RUNTIME)
    assert (u.tensor_parallel, u.stages, u.replicas, u.recompute, u.zero) == (2, 2, 1, "full", 1)
    assert u.group(0, 0) == ("n0/0", "n0/1") and u.group(1, 0) == ("n1/0", "n1/1")
    files = megatron.RUNTIME.render(u, plan, profile, cluster)
    args = files["megatron-args.txt"]
    for line in ("--tensor-model-parallel-size 2", "--recompute-granularity full", "--use-distributed-optimizer"):
        assert line in args
    # Megatron's validate_args asserts CUDA_DEVICE_MAX_CONNECTIONS=1 with TP > 1: every node script sets it
    scripts = [text for name, text in files.items() if name.startswith("node-")]
    assert len(scripts) == 2 and all("export CUDA_DEVICE_MAX_CONNECTIONS=1\n" in text for text in scripts)
    # DeepSpeed keeps the ZeRO-1 and the recomputation (no TP: one device per stage replica)
    d = uniform_structure(plan, profile, cluster, deepspeed.RUNTIME)
    assert (d.tensor_parallel, d.recompute, d.zero) == (1, "full", 1)
    ds_files = deepspeed.RUNTIME.render(d, plan, profile, cluster)
    assert '"stage": 1' in ds_files["ds_config.json"]
    assert '"activation_checkpoint_interval": 1' in ds_files["pipeline.json"]
    again = u.plan(plan)
    assert [s.tensor_parallel for s in again.pipelines[0].stages] == [2, 2]
    simulate(again, profile, cluster)  # the exported structure is a plan the simulator runs


def test_mixed_degrees_and_deepspeed_say_what_they_drop(inputs: Path, write_plan) -> None:
    path = write_plan(
        "mixed",
        pipelines=[
            pipeline(
                16,
                [4, 4, 4, 4],
                {"blocks": [0, 1], "devices": ["n0/0"]},
                _tp_stage(1, 13, "n1/0", "n1/1", recompute="selective"),
                {"blocks": [13, 14], "devices": ["n0/1"]},
            )
        ],
    )
    plan = load_plan(path)
    profile, cluster = load_plan_inputs(plan)
    u = uniform_structure(plan, profile, cluster, megatron.RUNTIME)
    assert u.tensor_parallel == 1
    assert any(
        line.startswith("tensor-parallel degree per stage (TP 1 on 2 devices, TP 2 on 2 devices)") for line in u.dropped
    )
    d = uniform_structure(plan, profile, cluster, deepspeed.RUNTIME)
    assert any(line.startswith("tensor parallelism (TP 1/2)") for line in d.dropped)
    # DeepSpeed checkpoints whole layers: the most used mode (selective, on a tie) becomes full
    assert (
        "recomputation per stage (none on 2 devices, selective on 2 devices): every DeepSpeed stage recomputes full"
        in (d.dropped)
    )
    assert d.recompute == "full"

"""The sync modes in the runtime, real ranks on gloo: top-k with ratio 1 is the all-reduce, Adasum
equals a one-process Adasum reference, every mode's loss falls, a killed rank stops every mode."""

from __future__ import annotations

import pytest
import torch
from builders import make_cluster, zoo_profile

from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.runtime.checkpoint import read_block
from hetplan.runtime.launcher import launch_local
from hetplan.runtime.reference import train_reference

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
STEPS = 3


def _stage(start: int, end: int, *devices: str, shares: tuple[float, ...] | None = None) -> Stage:
    return Stage(start, end, devices, shares or tuple(1.0 / len(devices) for _ in devices))


#: two pipelines cut differently, unequal batch shares, a replicated stage: every combination path
PIPELINES = [
    Pipeline(5, (2, 3), (_stage(0, 2, "n0/0", "n0/1", shares=(0.6, 0.4)), _stage(2, 6, "n0/2"))),
    Pipeline(3, (3,), (_stage(0, 6, "n0/3"),)),
]


def _plan(sync: str, **options) -> Plan:
    return Plan(global_batch=8, pipelines=PIPELINES, optimizer="adam", sync=sync, sync_options=options)


def _run(tmp_path, plan: Plan, *, steps: int = STEPS, **kw):
    cluster = make_cluster([("n0", [("cpu", 4)])])
    config = build_rank_config(plan, zoo_profile(GPT), cluster, seed=7, backend="gloo", timeout_s=kw.pop("timeout", 60))
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    return launch_local(path, steps=steps, **kw), config


def _losses(result) -> list[float]:
    return [r["loss"] for r in sorted(result.records, key=lambda r: r["step"]) if r["rank"] == 0]


def test_topk_ratio_one_is_the_all_reduce(tmp_path) -> None:
    result, config = _run(tmp_path, _plan("topk", ratio=1.0))
    losses, _ = train_reference(GPT, global_batch=8, optimizer="adam", lr=config["training"]["lr"], seed=7, steps=STEPS)
    assert _losses(result) == pytest.approx(losses, abs=1e-5)


def test_adasum_equals_a_one_process_adasum_reference(tmp_path) -> None:
    result, config = _run(tmp_path, _plan("adasum"), save=tmp_path / "ckpt")
    losses, blocks = train_reference(
        GPT,
        global_batch=8,
        optimizer="adam",
        lr=config["training"]["lr"],
        seed=7,
        steps=STEPS,
        adasum_batches=[p.batch for p in PIPELINES],
    )
    assert _losses(result) == pytest.approx(losses, abs=1e-5)
    for i, block in enumerate(blocks):
        saved = read_block(tmp_path / "ckpt", i).params
        for name, value in block.state_dict().items():
            torch.testing.assert_close(saved[name], value.detach(), atol=1e-5, rtol=0)
    # and it is not the all-reduce: the pipelines' gradients disagree, Adasum counts their overlap once
    plain, _ = train_reference(GPT, global_batch=8, optimizer="adam", lr=config["training"]["lr"], seed=7, steps=STEPS)
    assert abs(_losses(result)[-1] - plain[-1]) > 1e-6


@pytest.mark.parametrize(("sync", "options"), [("topk", {"ratio": 0.05}), ("adasum", {})])
def test_the_loss_falls(tmp_path, sync: str, options: dict) -> None:
    result, _ = _run(tmp_path, _plan(sync, **options), steps=12)
    losses = _losses(result)
    assert sum(losses[-3:]) < sum(losses[:3]) - 0.05, losses


SAME_SHAPE = [
    Pipeline(4, (2, 2), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1"))),
    Pipeline(4, (2, 2), (_stage(0, 3, "n0/2"), _stage(3, 6, "n0/3"))),
]


@pytest.mark.parametrize(
    ("sync", "options"), [("topk", {"ratio": 0.05}), ("adasum", {}), ("wsp", {"staleness": 1}), ("sdpipe", {})]
)
def test_a_killed_rank_stops_every_mode_with_one_line(tmp_path, sync: str, options: dict) -> None:
    plan = Plan(global_batch=8, pipelines=SAME_SHAPE, optimizer="adam", sync=sync, sync_options=options)
    with pytest.raises(HetplanError) as info:
        _run(tmp_path, plan, steps=100_000, timeout=15, kill_rank_after=(1, 2.0))
    message = str(info.value)
    assert "\n" not in message and message.startswith("the run stopped: rank 1")


def _global_losses(result) -> list[float]:
    """Per step, the batch-weighted mean of the pipelines' losses (each rank logs its pipeline's)."""
    out = []
    for step in sorted({r["step"] for r in result.records}):
        first = {}
        for r in sorted(result.records, key=lambda r: r["rank"]):
            if r["step"] == step:
                first.setdefault(r["pipeline"], r["loss"])
        out.append(sum(PIPELINES[p].batch * loss for p, loss in first.items()) / 8)
    return out


def test_wsp_with_staleness_zero_is_the_all_reduce(tmp_path) -> None:
    result, config = _run(tmp_path, _plan("wsp", staleness=0, wave=1))
    losses, _ = train_reference(GPT, global_batch=8, optimizer="adam", lr=config["training"]["lr"], seed=7, steps=STEPS)
    assert _global_losses(result) == pytest.approx(losses, abs=1e-5)
    waves = [r["wave"] for r in result.records if "wave" in r]
    assert waves and all(w["waves_ahead"] == 0 for w in waves)


def test_wsp_never_runs_more_than_d_waves_ahead(tmp_path) -> None:
    """Pipeline 1 emulates a device 4x slower: pipeline 0 uses its slack, never more than D."""
    plan = _plan("wsp", staleness=2, wave=1)
    cluster = parse_cluster(
        {
            "schema": "hetplan/cluster/v1",
            "name": "t",
            "nodes": [{"name": "n0", "link": {"bandwidth": "1GB/s"}, "devices": [
                {"type": "cpu", "count": 3},
                {"type": "slow", "count": 1, "emulate": {"base": "cpu", "slowdown": 4.0}},
            ]}],
            "network": {"bandwidth": "1GB/s"},
        },
        file="slow.yaml",
    )  # fmt: skip
    config = build_rank_config(plan, zoo_profile(GPT), cluster, seed=7, backend="gloo", timeout_s=60)
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    result = launch_local(path, steps=8, emulate=True)
    ahead = [r["wave"]["waves_ahead"] for r in result.records if "wave" in r]
    assert max(ahead) <= 2
    assert max(ahead) >= 1  # the fast pipeline did run ahead of the slow one


def test_sdpipe_trains_and_groups_pipelines(tmp_path) -> None:
    plan = Plan(global_batch=8, pipelines=SAME_SHAPE, optimizer="adam", sync="sdpipe", sync_options={"group_size": 2})
    result, _ = _run(tmp_path, plan, steps=12)
    groups = [tuple(r["group"]) for r in result.records if "group" in r]
    assert groups and all(g in ((0, 1), (0,), (1,)) for g in groups)
    losses = [r["loss"] for r in sorted(result.records, key=lambda r: r["step"]) if r["rank"] == 0]
    assert sum(losses[-3:]) < sum(losses[:3]) - 0.05, losses

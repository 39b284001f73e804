"""fp16 under the sync modes, real ranks on gloo: a forced gradient overflow on one rank skips the
step on every rank whose update depends on it and backs their loss scale off; wsp with staleness 0
and waves of one step is the single-process fp16 run.

The overflow comes from the executor's test hook (``HETPLAN_TEST_OVERFLOW=RANK:STEP``: that last
stage multiplies its loss by inf in the backward of that step; the logged loss stays finite). SGD
throughout: Adam divides a loss scale error away, SGD does not.
"""

from __future__ import annotations

import pytest
import torch
from builders import make_cluster, zoo_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.runtime.checkpoint import read_blocks, read_manifest, resolve_checkpoint
from hetplan.runtime.executor import OVERFLOW_ENV
from hetplan.runtime.launcher import launch_local
from hetplan.runtime.reference import train_reference

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
SCALE = 2.0**16  # LossScaler's initial scale
LR = 0.05

#: two pipelines of one structure (sdpipe needs it), two stages each: pipeline 0's last stage is n0/1
PIPELINES = [
    Pipeline(4, (2, 2), (Stage(0, 3, ("n0/0",), (1.0,)), Stage(3, 6, ("n0/1",), (1.0,)))),
    Pipeline(4, (2, 2), (Stage(0, 3, ("n0/2",), (1.0,)), Stage(3, 6, ("n0/3",), (1.0,)))),
]


def _run(tmp_path, sync: str, options: dict, *, steps: int, **kw):
    plan = Plan(global_batch=8, pipelines=PIPELINES, optimizer="sgd", sync=sync, sync_options=options, dtype="fp16")
    cluster = make_cluster([("n0", [("cpu", 4)])])
    config = build_rank_config(plan, zoo_profile(GPT), cluster, seed=5, lr=LR, backend="gloo", timeout_s=90)
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    return launch_local(path, steps=steps, **kw)


def _weights(ckpt, step: int) -> dict[str, torch.Tensor]:
    manifest = read_manifest(resolve_checkpoint(ckpt, step))
    blocks = read_blocks(ckpt, sorted(manifest.blocks), step=step)
    return {f"{b}/{k}": v for b, saved in blocks.items() for k, v in saved.params.items()}


@pytest.mark.parametrize(
    ("sync", "options"),
    [("allreduce", {}), ("wsp", {"staleness": 0, "wave": 1}), ("topk", {"ratio": 0.5}), ("adasum", {})],
)
def test_a_forced_overflow_skips_the_step_on_every_rank(tmp_path, monkeypatch, sync: str, options: dict) -> None:
    """Rank 1 overflows at step 1: every rank skips it (the weights saved after steps 1 and 2 are the
    same bits), halves its scale there, and trains on at step 2."""
    monkeypatch.setenv(OVERFLOW_ENV, "1:1")
    ckpt = tmp_path / "ckpt"
    result = _run(tmp_path, sync, options, steps=3, save=ckpt, save_every=1)
    by_step = {s: [r for r in result.records if r["step"] == s] for s in range(3)}
    assert all(len(rs) == 4 for rs in by_step.values())
    assert [all(r["skipped_step"] for r in by_step[s]) for s in range(3)] == [False, True, False]
    assert not any(r["skipped_step"] for s in (0, 2) for r in by_step[s])
    assert {r["loss_scale"] for r in by_step[0]} == {SCALE}
    assert {r["loss_scale"] for s in (1, 2) for r in by_step[s]} == {SCALE / 2}
    before, after, last = _weights(ckpt, 1), _weights(ckpt, 2), _weights(ckpt, 3)
    assert sorted(before) == sorted(after)
    for name, value in before.items():
        assert torch.isfinite(value.float()).all(), name
        assert torch.equal(after[name], value), name  # weights unchanged everywhere
    assert any(not torch.equal(last[n], after[n]) for n in after)  # and step 2 trains again


def test_sdpipe_overflow_skips_the_pipeline_that_overflowed(tmp_path, monkeypatch) -> None:
    """sdpipe steps each pipeline on its own gradients: the overflowing pipeline's ranks skip and back
    off, the other pipeline's update does not depend on it and steps; the group average stays finite."""
    monkeypatch.setenv(OVERFLOW_ENV, "1:1")
    result = _run(tmp_path, "sdpipe", {"group_size": 2}, steps=3)
    at = {(r["step"], r["device"]): r for r in result.records}
    for device in ("n0/0", "n0/1"):
        assert [at[(s, device)]["skipped_step"] for s in range(3)] == [False, True, False]
        assert [at[(s, device)]["loss_scale"] for s in range(3)] == [SCALE, SCALE / 2, SCALE / 2]
    for device in ("n0/2", "n0/3"):
        assert [at[(s, device)]["skipped_step"] for s in range(3)] == [False, False, False]
        assert at[(2, device)]["loss_scale"] == SCALE
    assert all(r["loss"] is not None and r["loss"] == r["loss"] for r in result.records)


def test_wsp_fp16_staleness_zero_is_the_single_process_fp16_run(tmp_path) -> None:
    """The issue's case (it gave [3.476, nan, nan]): the pushed gradients are unscaled now."""
    result = _run(tmp_path, "wsp", {"staleness": 0, "wave": 1}, steps=3)
    losses = []
    for s in range(3):
        first = {}
        for r in sorted(result.records, key=lambda r: r["rank"]):
            if r["step"] == s:
                first.setdefault(r["pipeline"], r["loss"])
        losses.append(sum(PIPELINES[p].batch * loss for p, loss in first.items()) / 8)
    expect, _ = train_reference(GPT, global_batch=8, optimizer="sgd", lr=LR, seed=5, steps=3, dtype="fp16")
    assert losses == pytest.approx(expect, abs=2e-3), (losses, expect)
    assert losses[-1] < losses[0]

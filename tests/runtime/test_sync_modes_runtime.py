"""The sync modes in the runtime, real ranks on gloo: top-k with ratio 1 is the all-reduce, Adasum
equals a one-process Adasum reference, every mode's loss falls, a killed rank stops every mode."""

from __future__ import annotations

import pytest
import torch
from builders import make_cluster, zoo_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.models import resolve_model
from hetplan.runtime.checkpoint import read_block
from hetplan.runtime.data import open_samples
from hetplan.runtime.launcher import launch_local
from hetplan.runtime.precision import Precision, run_blocks
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


def _weighted_adasum(a: torch.Tensor, b: torch.Tensor, wa: float, wb: float) -> torch.Tensor:
    """Two pipelines' updates of one tensor by the weighted Adasum rule (hetplan.runtime.sync.adasum's
    doc), written out here (float64); equal weights give the paper's formula."""
    a, b = a.double().flatten(), b.double().flatten()
    ca, cb = wa * 2 / (wa + wb), wb * 2 / (wa + wb)
    dot, la, lb = a @ b, a @ a, b @ b
    alpha, beta = (ca + cb - 1) * cb / (ca + cb), (ca + cb - 1) * ca / (ca + cb)
    return ca * a + cb * b - dot * (alpha * a / la + beta * b / lb)


def _adasum_adam_reference(lr: float, steps: int) -> tuple[list[float], list[torch.nn.Module]]:
    """Horovod's Adasum with Adam, one process: each pipeline its own model copy and Adam, stepped
    on its own rows' mean gradient; the parameter changes combined tensor by tensor; every copy set
    to old + combined."""
    zoo = resolve_model(GPT)
    samples = open_samples(GPT, zoo, global_batch=8, seed=7)
    copies = [zoo.build_blocks(0, zoo.n_blocks, 7) for _ in PIPELINES]
    params = [[p for b in blocks for p in b.parameters()] for blocks in copies]
    opts = [Precision("fp32", ps, optimizer="adam", lr=lr) for ps in params]
    losses = []
    for step in range(steps):
        old = [p.detach().clone() for p in params[0]]
        total, lo = 0.0, 0
        for pipe, blocks, ps, opt in zip(PIPELINES, copies, params, opts, strict=True):
            opt.zero_grad()
            inputs, targets = samples.step(step).rows(lo, lo + pipe.batch)
            loss = zoo.loss(run_blocks(blocks, inputs, torch.float32).float(), targets)
            (loss / pipe.batch).backward()
            total += float(loss.detach())
            for p in ps:
                opt.accumulate_one(p)
            opt.step(nonfinite_anywhere=0)
            lo += pipe.batch
        losses.append(total / 8)
        with torch.no_grad():
            for i, start in enumerate(old):
                d0, d1 = (params[k][i].detach() - start for k in range(2))
                new = start.double() + _weighted_adasum(d0, d1, PIPELINES[0].batch, PIPELINES[1].batch).view_as(start)
                for ps in params:
                    ps[i].copy_(new.float())
    return losses, copies[0]


def test_adasum_with_adam_combines_each_pipelines_parameter_changes(tmp_path) -> None:
    result, config = _run(tmp_path, _plan("adasum"), save=tmp_path / "ckpt")
    losses, blocks = _adasum_adam_reference(config["training"]["lr"], STEPS)
    assert _losses(result) == pytest.approx(losses, abs=1e-5)
    for i, block in enumerate(blocks):
        saved = read_block(tmp_path / "ckpt", i).params
        for name, value in block.state_dict().items():
            torch.testing.assert_close(saved[name], value.detach(), atol=1e-5, rtol=0)
    # and it is not the all-reduce: the pipelines' changes disagree, Adasum counts their overlap once
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


# wsp: staleness 0 with one-step waves against the all-reduce, and a bound with a straggler, are in
# test_wsp_hetpipe.py (the check that no wave ran more than D ahead held by construction of the pull)


def test_sdpipe_trains(tmp_path) -> None:
    plan = Plan(global_batch=8, pipelines=SAME_SHAPE, optimizer="adam", sync="sdpipe", sync_options={"group_size": 2})
    result, _ = _run(tmp_path, plan, steps=12)
    losses = [r["loss"] for r in sorted(result.records, key=lambda r: r["step"]) if r["rank"] == 0]
    assert sum(losses[-3:]) < sum(losses[:3]) - 0.05, losses


# SDPipe's grouping by measured progress (only one grouping right): tests/runtime/test_sdpipe_groups.py

"""A run you can watch and trust: a line per step off a terminal, and non-finite losses.

The step lines are checked against the run log the ranks wrote (the same step, loss and slowest
rank's time); a non-finite loss either stops every rank at that step with one line, or, with
``--skip-nonfinite``, is skipped on every rank alike, which a plain PyTorch loop that skips the same
steps must match (two data-parallel replicas: only one of them sees the poisoned sample, so both
must learn of it from the all-reduce and skip together).
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from pathlib import Path

import pytest
import torch
from builders import run_cli, zoo_profile

from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.runlog import load_run_log
from hetplan.contracts.yamlio import write_yaml
from hetplan.models import resolve_model
from hetplan.runtime.data import open_samples
from hetplan.runtime.processes.watch import StepWatcher

ROOT = Path(__file__).resolve().parents[2]
LOCAL2 = ROOT / "profiles" / "clusters" / "local-2.yaml"
GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}

#: A user's regression model and a dataset of 16 samples whose sample 5 is NaN: with a global
#: batch of 8, an epoch is two steps and one of them holds it.
USER_MODULE = """
import torch
import torch.nn as nn
from torch.utils.data import Dataset


def build():
    return nn.Sequential(nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Linear(8, 1))


class Poisoned(Dataset):
    def __init__(self, bad):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(16, 4, generator=g)
        self.y = torch.randn(16, 1, generator=g)
        if bad is not None:
            self.x[bad] = float("nan")

    def __len__(self):
        return 16

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def data(bad=5):
    return Poisoned(bad)
"""


def _write_plan(folder: Path, plan: Plan, profile: ModelProfile) -> Path:
    write_yaml(profile.to_dict(), folder / "profile.yaml")
    plan = Plan(
        global_batch=plan.global_batch,
        pipelines=plan.pipelines,
        inputs={"profile": {"path": str(folder / "profile.yaml")}, "cluster": {"path": str(LOCAL2)}},
    )
    write_yaml(plan.to_dict(), folder / "plan.yaml")
    return folder / "plan.yaml"


def _two_stages(tmp_path: Path) -> Path:
    plan = Plan(
        global_batch=8,
        pipelines=[Pipeline(8, (4, 4), (Stage(0, 3, ("local/0",), (1.0,)), Stage(3, 6, ("local/1",), (1.0,))))],
    )
    return _write_plan(tmp_path, plan, zoo_profile(GPT))


def test_the_watcher_reports_a_step_once_every_rank_has_logged_it_and_never_a_half_line(tmp_path) -> None:
    def record(step: int, rank: int, seconds: float, loss: float | None, **extra) -> str:
        return json.dumps({"step": step, "rank": rank, "iteration_s": seconds, "loss": loss, **extra}) + "\n"

    watcher = StepWatcher(tmp_path, world=2, global_batch=8, steps=3)
    assert watcher.poll() == []  # no file yet
    (tmp_path / "rank-0.jsonl").write_text(record(0, 0, 0.5, 2.0) + record(1, 0, 0.25, 1.5))
    half = record(0, 1, 1.0, 2.0)
    (tmp_path / "rank-1.jsonl").write_text(half[:20])
    assert watcher.poll() == []  # rank 1 has not finished a line
    with (tmp_path / "rank-1.jsonl").open("a") as f:
        f.write(half[20:] + record(1, 1, 0.125, 1.5) + record(2, 1, 0.1, None, nonfinite="nan"))
    lines = watcher.poll()
    assert [(x.step, x.done, x.loss, x.step_s, x.samples_per_s) for x in lines] == [
        (0, 1, 2.0, 1.0, 8.0),  # the slowest rank's time
        (1, 2, 1.5, 0.25, 32.0),
    ]
    assert lines[1].text() == "step 2/3  loss 1.5000  250.0 ms/step  32.0 samples/s"
    with (tmp_path / "rank-0.jsonl").open("a") as f:
        f.write(record(2, 0, 0.2, None, nonfinite="nan"))
    (last,) = watcher.poll()
    assert (last.loss, last.nonfinite, last.skipped) == (None, "nan", 1)
    assert last.text().startswith("step 3/3  loss nan  200.0 ms/step")
    assert watcher.poll() == []  # nothing twice


def test_a_nan_loss_stops_every_rank_at_its_step_with_one_line_and_the_lines_match_the_log(tmp_path, capsys) -> None:
    """SGD at a learning rate of 1e12 blows the weights up in one step: step 1's loss is NaN."""
    plan = _two_stages(tmp_path)
    log = tmp_path / "run.jsonl"
    argv = ["launch", str(plan), "--steps", "50", "--optimizer", "sgd", "--lr", "1e12", "--log", str(log)]
    code, out, err = run_cli(argv, capsys)
    assert code == 2, err
    assert err.strip().splitlines() == [
        "error: step 1: the loss (nan) is not finite; stopped every rank there, without applying that step "
        f"(--skip-nonfinite skips such steps and goes on); run log: {log}"
    ]
    records = [json.loads(x) for x in log.read_text().splitlines()]
    assert sorted((r["step"], r["rank"]) for r in records) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(r["nonfinite"] == "nan" and r["loss"] is None for r in records if r["step"] == 1)
    # one line a step (not a terminal), with the log's loss and slowest rank's time
    lines = [x for x in out.splitlines() if x.startswith("step ")]
    assert len(lines) == 2, out
    first = [r for r in records if r["step"] == 0]
    slowest = max(r["iteration_s"] for r in first)
    assert lines[0] == (
        f"step 1/50  loss {first[0]['loss']:.4f}  {slowest * 1e3:.1f} ms/step  {8 / slowest:.1f} samples/s"
    )
    assert lines[1].startswith("step 2/50  loss nan  ") and "update skipped" in lines[1]
    # the log is a valid run log: report reads it and counts the step
    code, out, err = run_cli(["report", str(log), str(plan), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["nonfinite_steps"] == [1]


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    """A fresh, uniquely named model-and-dataset module, importable here and by the ranks."""
    name = f"user_nan_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    return name


def _plain_pytorch(model: dict, dataset: str, *, steps: int, lr: float, seed: int) -> tuple[list, list[int], list]:
    """The same blocks and samples in one process: torch.optim.SGD, and a step whose loss is not
    finite is not applied. Returns the losses (None: skipped), the skipped steps, the parameters."""
    zoo = resolve_model(model)
    blocks = zoo.build_blocks(0, zoo.n_blocks, seed)
    net = torch.nn.Sequential(*blocks)
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    samples = open_samples(model, zoo, global_batch=8, seed=seed, dataset=dataset)
    losses, skipped = [], []
    for step in range(steps):
        x, y = samples.step(step).rows(0, 8)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        if math.isfinite(float(loss.detach())):
            opt.step()
            losses.append(float(loss.detach()))
        else:
            losses.append(None)
            skipped.append(step)
    return losses, skipped, [p.detach().clone() for p in net.parameters()]


def test_skip_nonfinite_skips_the_step_on_every_replica_as_a_plain_loop_does(tmp_path, capsys, user_module) -> None:
    model = {"factory": f"{user_module}:build", "config": {}, "input_shape": [4]}
    zoo = resolve_model(model)
    timing = {"cpu": {1: Timing(1.0, 1.0)}}
    profile = ModelProfile(
        model=zoo.model,
        dtype="fp32",
        blocks=[Block(n, "zoo", 0, 0.0, 0.0, 0.0, 0.0, timing) for n in zoo.block_names()],
    )
    # two data-parallel replicas: the NaN sample is in one replica's half of its step only
    plan = Plan(
        global_batch=8,
        pipelines=[
            Pipeline(4, (2, 2), (Stage(0, 2, ("local/0",), (1.0,)),)),
            Pipeline(4, (2, 2), (Stage(0, 2, ("local/1",), (1.0,)),)),
        ],
    )
    path = _write_plan(tmp_path, plan, profile)
    steps, lr, log = 4, 0.1, tmp_path / "run.jsonl"
    want, skipped, _ = _plain_pytorch(model, f"{user_module}:data", steps=steps, lr=lr, seed=0)
    assert 1 <= len(skipped) < steps  # the poisoned sample lands in some steps, not all
    argv = ["launch", str(path), "--steps", str(steps), "--optimizer", "sgd", "--lr", str(lr), "--log", str(log)]
    argv += ["--dataset", f"{user_module}:data", "--skip-nonfinite", "--log-every", "2"]
    code, out, err = run_cli(argv, capsys)
    assert code == 0, err
    records = load_run_log(log)
    for rank in (0, 1):
        got = [r for r in records if r.rank == rank]
        assert [r.step for r in got if r.nonfinite] == skipped  # every replica skipped the same steps
        for r, expected in zip(got, want, strict=True):
            assert (r.loss is None) == (expected is None)
            if expected is not None:
                assert r.loss == pytest.approx(expected, abs=1e-5)
    # every 2 steps a line, the summary counts the skips
    assert [x.split()[1] for x in out.splitlines() if x.startswith("step ")] == ["2/4", "4/4"]
    assert re.search(rf"trained {steps} steps on 2 ranks: loss .*; {len(skipped)} non-finite step\(s\) skipped;", out)


def test_skip_nonfinite_is_refused_where_pipelines_step_apart(tmp_path) -> None:
    from builders import make_cluster

    from hetplan.errors import HetplanError
    from hetplan.local_job import TrainingOptions, train_here

    plan = Plan(
        global_batch=8,
        pipelines=[
            Pipeline(4, (4,), (Stage(0, 6, ("n0/0",), (1.0,)),)),
            Pipeline(4, (4,), (Stage(0, 6, ("n0/1",), (1.0,)),)),
        ],
        sync="sdpipe",
    )
    with pytest.raises(HetplanError, match=r"^--skip-nonfinite: sync sdpipe's pipelines step apart"):
        train_here(
            plan,
            zoo_profile(GPT),
            make_cluster([("n0", [("cpu", 2)])]),
            steps=1,
            options=TrainingOptions(),
            skip_nonfinite=True,
        )

"""What ``loss`` means in the run log of every sync mode: the global batch's mean loss.

Under wsp and sdpipe each rank logs its own pipeline's loss (``pipeline_loss``, with its
``pipeline_batch``) and the merged run log weighs them into the global batch's, the mean the
all-reduce logs. Two pipelines of unequal batch shares (5 and 3 samples), two stages each, SGD: WSP
with staleness 0 and one-step waves, and SDPipe with one group (both pipelines average every step),
are synchronous training, so their logged losses equal the all-reduce run's within 1e-6, where
either pipeline's own loss misses it by far more. The progress lines and a run log read back from
the ranks' own files say the same.
"""

from __future__ import annotations

import json

import pytest
from builders import make_cluster, zoo_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.runlog import load_run_log
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.runtime.launcher import launch_local

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
STEPS = 3

#: one structure (sdpipe needs it), unequal batch shares: the pipelines' losses differ from the mean
PIPELINES = [
    Pipeline(5, (2, 3), (Stage(0, 3, ("n0/0",), (1.0,)), Stage(3, 6, ("n0/1",), (1.0,)))),
    Pipeline(3, (3,), (Stage(0, 3, ("n0/2",), (1.0,)), Stage(3, 6, ("n0/3",), (1.0,)))),
]


def _run(tmp_path, sync: str, options: dict, *, name: str):
    plan = Plan(global_batch=8, pipelines=PIPELINES, optimizer="sgd", sync=sync, sync_options=options)
    cluster = make_cluster([("n0", [("cpu", 4)])])
    config = build_rank_config(plan, zoo_profile(GPT), cluster, seed=7, lr=0.1, backend="gloo", timeout_s=120)
    path = tmp_path / f"{name}.yaml"
    write_yaml(config, path)
    lines = []
    result = launch_local(path, steps=STEPS, run_dir=tmp_path / name, on_step=lines.append)
    return result, lines


def _by_step(records) -> dict[int, list[dict]]:
    return {s: [r for r in records if r["step"] == s] for s in range(STEPS)}


@pytest.fixture(scope="module")
def all_reduce(tmp_path_factory) -> list[float]:
    result, _ = _run(tmp_path_factory.mktemp("allreduce"), "allreduce", {}, name="allreduce")
    by_step = _by_step(result.records)
    for records in by_step.values():  # the all-reduced loss: one value on every rank of a step
        assert len({r["loss"] for r in records}) == 1
    return [by_step[s][0]["loss"] for s in range(STEPS)]


@pytest.mark.parametrize(
    ("sync", "options"), [("wsp", {"staleness": 0, "wave": 1}), ("sdpipe", {"group_size": 2})], ids=["wsp", "sdpipe"]
)
def test_the_logged_loss_is_the_global_batchs_as_the_all_reduce_logs_it(
    tmp_path, all_reduce: list[float], sync: str, options: dict
) -> None:
    result, lines = _run(tmp_path, sync, options, name=sync)
    by_step = _by_step(result.records)
    for step, records in by_step.items():
        assert len(records) == 4
        assert len({r["loss"] for r in records}) == 1  # every rank's line of the step: the same value
        assert records[0]["loss"] == pytest.approx(all_reduce[step], abs=1e-6, rel=0), (step, all_reduce)
    assert abs(all_reduce[-1] - all_reduce[0]) > 1e-3  # it trained: equal losses are not idle runs
    # each pipeline's own loss is not the global batch's: logging it would fail the check above
    worst = max(abs(r["pipeline_loss"] - all_reduce[r["step"]]) for r in result.records)
    assert worst > 1e-3
    assert {(r["pipeline"], r["pipeline_batch"]) for r in result.records} == {(0, 5), (1, 3)}
    if sync == "sdpipe":  # one group: both pipelines averaged together every step
        assert {tuple(r["group"]) for r in result.records} == {(0, 1)}
    # the progress lines show the same loss as the merged log
    assert [line.step for line in lines] == list(range(STEPS))
    assert [line.loss for line in lines] == pytest.approx([by_step[s][0]["loss"] for s in range(STEPS)], abs=1e-12)
    # the ranks' own lines carry no global loss; read back as one log, they get it
    raw = tmp_path / "ranks.jsonl"
    raw.write_text("".join((tmp_path / sync / f"rank-{r}.jsonl").read_text() for r in range(4)), encoding="utf-8")
    own = [json.loads(line) for line in raw.read_text().splitlines()]
    assert all(r["loss"] is None and r["pipeline_loss"] is not None for r in own)
    loaded = load_run_log(raw)
    assert len(loaded) == 4 * STEPS
    for record in loaded:
        assert record.loss == pytest.approx(all_reduce[record.step], abs=1e-6, rel=0)
        assert record.pipeline_batch == PIPELINES[record.pipeline].batch

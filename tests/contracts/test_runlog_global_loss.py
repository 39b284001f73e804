"""The run log's global-batch loss from the pipelines' own (wsp, sdpipe): the sample-weighted mean
over every pipeline's line of a step, none while a pipeline's line is missing, the same whether the
launcher merges the ranks' lines, the progress watcher reads them, or a log is loaded from them."""

from __future__ import annotations

import json

import pytest

from hetplan.contracts.runlog import RUNLOG_SCHEMA, fill_global_loss, global_batch_losses, load_run_log
from hetplan.runtime.processes.watch import StepWatcher


def _line(step: int, rank: int, pipeline: int, loss: float | None, batch: int, **extra) -> dict:
    return {
        "schema": RUNLOG_SCHEMA,
        "step": step,
        "rank": rank,
        "pipeline": pipeline,
        "stage": 0,
        "device": f"n0/{rank}",
        "iteration_s": 0.1,
        "compute_s": 0.05,
        "wait_s": 0.0,
        "comm_s": 0.0,
        "loss": None,
        "peak_memory_bytes": None,
        "pipeline_loss": loss,
        "pipeline_batch": batch,
        **extra,
    }


#: pipeline 0 (ranks 0, 1; 5 samples) and pipeline 1 (rank 2; 3 samples); rank 2 has not logged step 1
LINES = [
    _line(0, 0, 0, 2.0, 5),
    _line(0, 1, 0, 2.0, 5),
    _line(0, 2, 1, 4.0, 3, wave={"clock": 0, "version": 1, "waves_ahead": 0, "own_waves": 0}),
    _line(1, 0, 0, 1.0, 5),
    _line(1, 1, 0, 1.0, 5),
]


def test_the_global_loss_is_the_sample_weighted_mean_of_the_pipelines() -> None:
    rows = [(r["step"], r["pipeline"], r["pipeline_loss"], r["pipeline_batch"]) for r in LINES]
    assert global_batch_losses(rows) == {0: pytest.approx((5 * 2.0 + 3 * 4.0) / 8)}  # 2.75, not 3.0
    assert global_batch_losses(rows, global_batch=8) == {0: pytest.approx(2.75)}
    assert global_batch_losses(rows, global_batch=9) == {}  # a pipeline the log never saw: no loss


def test_the_merge_fills_every_line_of_a_complete_step_only() -> None:
    merged = fill_global_loss(LINES, global_batch=8)
    assert [r["loss"] for r in merged] == [pytest.approx(2.75)] * 3 + [None, None]
    assert [r["pipeline_loss"] for r in merged] == [r["pipeline_loss"] for r in LINES]  # kept as logged
    assert all(r["loss"] is None for r in LINES)  # the input is left alone
    plain = [{"step": 0, "rank": 0, "pipeline": 0, "loss": 1.5}]  # an all-reduce run's line
    assert fill_global_loss(plain) == plain


def test_a_log_of_the_ranks_own_lines_loads_with_the_global_loss(tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in LINES), encoding="utf-8")
    records = load_run_log(path)
    assert [r.loss for r in records] == [pytest.approx(2.75)] * 3 + [None, None]
    assert [(r.pipeline_loss, r.pipeline_batch) for r in records[:3]] == [(2.0, 5), (2.0, 5), (4.0, 3)]
    assert records[2].wave == {"clock": 0, "version": 1, "waves_ahead": 0, "own_waves": 0}  # wsp's, as logged


def test_the_progress_line_shows_the_global_loss(tmp_path) -> None:
    for rank in range(3):
        lines = [r for r in LINES if r["rank"] == rank]
        (tmp_path / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    watcher = StepWatcher(tmp_path, world=3, global_batch=8, steps=2)
    lines = watcher.poll()
    assert [(x.step, x.loss) for x in lines] == [(0, pytest.approx(2.75))]  # step 1 waits for rank 2

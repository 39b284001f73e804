"""Issue 24's rough edges in what ``plan``, ``show`` and ``compare`` print: runners-up that repeat the
winner or lose their emulated type names, 128 micro-batch sizes in a row, ``compare --with`` of
plans with different global batches, and hundreds of alike pipelines printed device by device."""

from __future__ import annotations

import functools
from dataclasses import replace
from types import SimpleNamespace

import pytest
from builders import make_cluster, make_profile
from rich.console import Console

from hetplan.solve import PlanOptions, plan_training
from hetplan.solve.compare import compare_rows
from hetplan.solve.search import Candidate, plan_details
from hetplan.views.plan import compare_table, micro_batch_runs, plan_summary_renderables

A100, T4 = "A100-80GB", "T4"


def _inputs():
    profile = make_profile(6, per_block={A100: [(1.0, 2.0)] * 6, T4: [(4.0, 8.0)] * 6})
    cluster = make_cluster([("n0", [(A100, 2)]), ("n1", [(T4, 1)])], inter="10GB/s")
    return profile, cluster


def _text(renderables) -> str:
    console = Console(width=200, record=True)
    for r in renderables:
        console.print(r)
    return console.export_text()


@functools.cache
def _planned(batch: int = 8):
    profile, cluster = _inputs()
    return plan_training(profile, cluster, PlanOptions(global_batch=batch, optimizer="sgd")), profile, cluster


def test_runners_up_leave_out_the_winner_in_another_form_and_repeated_structures() -> None:
    result, _, cluster = _planned()
    best = result.sim.iteration_s

    def candidate(label: str, seconds: float) -> Candidate:
        sim = SimpleNamespace(iteration_s=seconds, bottleneck="compute on n0/0")
        return Candidate(label, replace(result.plan, global_batch=result.plan.global_batch), 0.0, sim)  # type: ignore[arg-type]

    ties = [candidate("1 x [2xcpu-fast], 2 x [cpu-slow]", best), candidate("1 x [2xcpu-fast], 2 x [cpu-slow]", best)]
    slower = [candidate("2 x [cpu-fast], 1 x [cpu-slow > cpu-slow]", best * 1.05)] * 2
    other = candidate("2 x [cpu-fast], 2 x [cpu-slow]", best * 1.06)
    runners = plan_details(replace(result, candidates=[*ties, *slower, other]), cluster)["runners_up"]
    assert [r["structure"] for r in runners] == [slower[0].label, other.label]
    assert all(r["slower_by"] > 0 for r in runners)


def test_runners_up_print_emulated_type_names_in_brackets() -> None:
    """``2 x [cpu-slow]`` is not rich markup: it printed as ``2 x ``."""
    result, profile, cluster = _planned()
    plan = replace(result.plan, predicted=result.sim.predicted())
    runner = {"structure": "1 x [2xcpu-fast], 2 x [cpu-slow]", "iteration_s": 1.0, "slower_by": 0.05}
    plan.details = {"runners_up": [{**runner, "bottleneck": "compute on local/1"}]}
    text = _text(plan_summary_renderables(plan, cluster, profile))
    assert "1 x [2xcpu-fast], 2 x [cpu-slow]" in text


def test_micro_batch_runs_fold_long_runs() -> None:
    assert micro_batch_runs([32] * 128) == "128x32"
    assert micro_batch_runs([16] + [32] * 127) == "16 127x32"
    assert micro_batch_runs([3, 4, 4]) == "3 4 4"
    assert micro_batch_runs([1, 2, 2, 2, 1]) == "1 3x2 1"
    assert micro_batch_runs([]) == ""


def test_the_plan_table_prints_many_micro_batches_as_runs() -> None:
    result, profile, cluster = _planned()
    ones = [replace(p, micro_batches=(1,) * p.batch) for p in result.plan.pipelines]
    plan = replace(result.plan, pipelines=ones, predicted=result.sim.predicted())
    many = max(plan.pipelines, key=lambda p: len(p.micro_batches))
    assert len(many.micro_batches) >= 3
    text = _text(plan_summary_renderables(plan, cluster, profile))
    assert micro_batch_runs(many.micro_batches) in text
    assert " ".join(map(str, many.micro_batches)) not in text


def test_compare_with_a_plan_of_another_global_batch_is_per_sample_and_says_so() -> None:
    small, profile, cluster = _planned(batch=8)
    # the same pipelines with twice the samples each: another global batch, same inputs
    doubled = [replace(p, batch=2 * p.batch, micro_batches=p.micro_batches * 2) for p in small.plan.pipelines]
    large = replace(small.plan, global_batch=16, pipelines=doubled)
    rows = compare_rows(small.plan, profile, cluster, others={"large": large})
    row = rows[-1]
    assert row["per_sample"] is True and row["global_batch"] == 16
    ours = rows[0]["iteration_s"] / 8
    theirs = row["iteration_s"] / 16
    assert row["speedup"] == theirs / ours
    # per step the doubled batch takes twice as long; per sample they are alike (not "2.00x")
    assert row["iteration_s"] == pytest.approx(2 * rows[0]["iteration_s"])
    assert row["speedup"] == pytest.approx(1.0)
    text = _text([compare_table(rows)])
    assert "per sample" in text and "large has global batch 16" in text
    same = compare_rows(small.plan, profile, cluster, others={"again": small.plan})[-1]
    assert "per_sample" not in same and same["speedup"] == 1.0


def test_the_plan_table_prints_runs_of_alike_pipelines_once() -> None:
    """A 512-device plan of 200 pipelines printed 512 device rows: three or more alike pipelines in a
    row (batch, micro-batches, stages, types, headroom) print the first whole and the rest as one row
    naming how many devices on which nodes; two alike, or pipelines that differ, print whole."""
    from hetplan.contracts.plan import Pipeline, Plan, Stage

    profile = make_profile(4, per_block={A100: [(1.0, 2.0)] * 4, T4: [(4.0, 8.0)] * 4})
    cluster = make_cluster([(f"n{i}", [(A100, 2)]) for i in range(4)] + [("t", [(T4, 2)])], inter="10GB/s")

    def pipe(node: str, batch: int = 4) -> Pipeline:
        return Pipeline(
            batch, (2,) * (batch // 2), (Stage(0, 2, (f"{node}/0",), (1.0,)), Stage(2, 4, (f"{node}/1",), (1.0,)))
        )

    pipes = [*(pipe(f"n{i}") for i in range(4)), pipe("t", 2)]
    plan = Plan(global_batch=18, pipelines=pipes, optimizer="sgd")
    text = _text(plan_summary_renderables(plan, cluster, profile))
    assert "n0/0" in text and "n0/1" in text  # the first of the run, whole
    assert "n1/0" not in text and "n3/1" not in text
    assert "1-3" in text and "6 devices on 3 node(s), n1 to n3" in text and "as pipe 0" in text
    assert "t/0" in text and "t/1" in text  # another shape: printed whole
    # two alike in a row are printed whole
    two = Plan(global_batch=10, pipelines=[pipe("n0"), pipe("n1"), pipe("t", 2)], optimizer="sgd")
    text = _text(plan_summary_renderables(two, cluster, profile))
    assert all(f"{n}/{d}" in text for n in ("n0", "n1", "t") for d in (0, 1)) and "as pipe" not in text

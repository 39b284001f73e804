"""``hetplan what-if`` end to end: files written, the table, one-line errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from builders import run_cli, write_what_if_inputs

from hetplan.contracts.cluster import load_cluster
from hetplan.contracts.plan import load_plan
from hetplan.errors import HetplanError
from hetplan.solve.whatif import OBJECTIVES


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    return write_what_if_inputs(tmp_path)


def test_what_if_writes_plan_cluster_summary_and_pareto(inputs: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "wi"
    argv = ["what-if", str(inputs["profile"]), str(inputs["cluster"]), "--pool", str(inputs["pool"]), "--batch", "8"]
    argv += ["--objective", "cheapest-run", "--samples", "800", "--micro-batch-sizes", "1,2"]
    argv += ["--pareto", str(tmp_path / "front.svg"), "-o", str(out)]
    code, stdout, stderr = run_cli(argv, capsys)
    assert code == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    chosen = summary["chosen"]
    assert "$/step" in stdout and "Pareto" in stdout
    plan = load_plan(out / "plan.yaml")
    cluster = load_cluster(out / "cluster.yaml")
    assert plan.predicted["iteration_s"] == pytest.approx(chosen["iteration_s"])
    assert cluster.price_per_hour == pytest.approx(chosen["usd_per_hour"])
    assert chosen["usd_per_run"] == pytest.approx(100 * chosen["usd_per_step"])
    assert (tmp_path / "front.svg").read_text().startswith("<svg")


def test_bad_pool_is_one_line(inputs: dict[str, Path], tmp_path: Path, capsys) -> None:
    inputs["pool"].write_text(inputs["pool"].read_text().replace("count: 1", "count: -3"))
    argv = ["what-if", str(inputs["profile"]), str(inputs["cluster"]), "--pool", str(inputs["pool"]), "--batch", "8"]
    code, _, stderr = run_cli([*argv, "-o", str(tmp_path / "wi")], capsys)
    assert code == 2
    assert stderr.strip().count("\n") == 0
    assert stderr.startswith(f"error: {inputs['pool']}: nodes[0].count: expected")


def test_objective_needs_its_option(inputs: dict[str, Path], tmp_path: Path, capsys) -> None:
    argv = ["what-if", str(inputs["profile"]), str(inputs["cluster"]), "--batch", "8", "-o", str(tmp_path / "w")]
    code, _, stderr = run_cli([*argv, "--objective", "fastest-within-budget"], capsys)
    assert code == 2
    assert stderr.strip() == "error: --objective: fastest-within-budget needs --budget-per-hour"


def test_cli_lists_every_objective() -> None:
    from hetplan.cli import WHAT_IF_OBJECTIVES

    assert tuple(WHAT_IF_OBJECTIVES) == OBJECTIVES


def test_show_and_compare_print_cost_where_prices_are_known(inputs: dict[str, Path], tmp_path: Path, capsys) -> None:
    out = tmp_path / "wi"
    argv = ["what-if", str(inputs["profile"]), str(inputs["cluster"]), "--batch", "8", "--micro-batch-sizes", "1"]
    assert run_cli([*argv, "--no-marginals", "-o", str(out)], capsys)[0] == 0
    summary = json.loads((out / "summary.json").read_text())
    step = summary["chosen"]["usd_per_step"]  # one V100-16GB at the catalog's $2.80/h
    assert step == pytest.approx(2.80 * summary["chosen"]["iteration_s"] / 3600)
    code, shown, err = run_cli(["show", str(out / "plan.yaml")], capsys)
    assert code == 0, err
    assert "cost: $2.80/h for the cluster" in shown and "/step" in shown and "/sample" in shown
    code, compared, err = run_cli(["compare", str(out / "plan.yaml")], capsys)
    assert code == 0, err
    assert "$/step" in compared and "$/sample" in compared


def test_pool_validates_and_shows(inputs: dict[str, Path], capsys) -> None:
    code, out, err = run_cli(["validate", str(inputs["pool"])], capsys)
    assert code == 0, err
    assert "(pool)" in out
    code, out, err = run_cli(["show", str(inputs["pool"])], capsys)
    assert code == 0, err
    assert "1 x A100-40GB" in out and "$3.74" in out


def test_deadline_and_throughput_become_an_iteration_limit() -> None:
    from hetplan.solve.whatif_job import WhatIfRequest, objective_from

    req = WhatIfRequest(profile="p", cluster="c", global_batch=100, output="o", objective="cheapest-meeting")
    # 1,000,000 samples = 10,000 steps in 10 hours: at most 3.6 s a step; 50 samples/s: at most 2 s
    limited = objective_from(replace(req, deadline_hours=10.0), 1_000_000)
    assert limited.max_iteration_s == pytest.approx(3.6)
    both = objective_from(replace(req, deadline_hours=10.0, min_samples_per_s=50.0), 1_000_000)
    assert both.max_iteration_s == pytest.approx(2.0)
    with pytest.raises(HetplanError, match="needs --min-samples-per-s or --deadline-hours"):
        objective_from(req, None)
    with pytest.raises(HetplanError, match="--deadline-hours needs the run's length"):
        objective_from(replace(req, deadline_hours=1.0), None)

"""``hetplan launch`` and ``hetplan report`` end to end on a tiny measured model."""

from __future__ import annotations

import json
import re

import pytest

from hetplan.cli import main


def test_profile_plan_launch_report(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setattr("hetplan.local_job.usable_cores", lambda: 1)  # as on a machine with fewer cores than ranks
    profile, plan, log = tmp_path / "p.yaml", tmp_path / "plan.yaml", tmp_path / "run.jsonl"
    steps = [
        [
            "profile",
            "gpt",
            "--layers",
            "2",
            "--hidden",
            "32",
            "--heads",
            "2",
            "--seq",
            "8",
            "--vocab",
            "31",
            "--micro-batches",
            "1,2",
            "--repeat",
            "2",
            "--warmup",
            "1",
            "-o",
            str(profile),
        ],
        ["plan", str(profile), "profiles/clusters/local-2.yaml", "--batch", "8", "-o", str(plan)],
        ["launch", str(plan), "--steps", "3", "--emulate", "--log", str(log)],
        ["report", str(log), str(plan), "--json"],
    ]
    outputs = {}
    for args in steps:
        with pytest.raises(SystemExit) as info:
            main(args)
        outputs[args[0]] = capsys.readouterr()
        assert info.value.code == 0, (args[0], outputs[args[0]].err)
    out = outputs["report"].out
    report = json.loads(out[out.index("{") :])
    assert report["steps"] == 3 and report["emulated"]
    # one median for one run: the launch summary's is the report's
    launched = re.search(r"median iteration ([0-9.]+) ms", outputs["launch"].out)
    assert launched and launched.group(1) == f"{report['measured_iteration_s'] * 1e3:.1f}", outputs["launch"].out
    # 2 ranks on "1 core": one line of warning before the run, with the prediction and the likely time
    (warning,) = [x for x in outputs["launch"].err.splitlines() if x.startswith("warning:")]
    predicted = report["predicted_iteration_s"] * 1e3
    assert warning.startswith("warning: 2 ranks x 1 thread share this machine's 1 core: steps will likely take ")
    assert f"about 2.0x the predicted {predicted:.1f} ms (~{predicted * 2:.0f} ms)" in warning
    assert report["measured_iteration_s"] > 0 and report["predicted_iteration_s"] > 0
    # peak tensor memory per rank, measured (the CPU allocator profile of one step) beside predicted
    assert len(report["memory"]) == 2
    for rank in report["memory"]:
        assert rank["peak_memory_bytes"] > 0 and rank["predicted_peak_memory_bytes"] > 0
        assert rank["measured_by"] == "cpu allocator profile"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert {r["step"] for r in records} == {0, 1, 2}
    assert all(r["loss"] == records[0]["loss"] for r in records if r["step"] == 0)


def test_a_user_factory_model_profiles_plans_and_trains(tmp_path, capsys, monkeypatch) -> None:
    (tmp_path / "my_models.py").write_text(
        "import torch.nn as nn\n\n"
        "def build(width=16):\n"
        "    return nn.Sequential(nn.Sequential(nn.Linear(8, width), nn.ReLU()),\n"
        "                         nn.Sequential(nn.Linear(width, width), nn.ReLU()), nn.Linear(width, 4))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from pathlib import Path

    clusters = Path(__file__).resolve().parents[2] / "profiles" / "clusters"
    steps = [
        [
            "profile",
            "my_models:build",
            "--input-shape",
            "8",
            "--kwargs",
            "width=32",
            "--micro-batches",
            "1,2",
            "--repeat",
            "2",
            "-o",
            "mine.yaml",
        ],
        ["plan", "mine.yaml", str(clusters / "local-2.yaml"), "--batch", "8", "-o", "plan.yaml"],
        ["simulate", "plan.yaml"],
        ["launch", "plan.yaml", "--steps", "2"],
    ]
    for args in steps:
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 0, (args[0], capsys.readouterr().err)
    assert "trained 2 steps" in capsys.readouterr().out


def test_a_run_log_of_another_plan_is_refused(tmp_path, capsys) -> None:
    from hetplan.contracts.plan import Pipeline, Plan, Stage
    from hetplan.contracts.runlog import StepRecord, check_log_matches
    from hetplan.errors import HetplanError

    plan = Plan(global_batch=2, pipelines=[Pipeline(2, (1, 1), (Stage(0, 2, ("n0/0",), (1.0,)),))])
    record = StepRecord(
        step=0,
        rank=0,
        pipeline=0,
        stage=0,
        device="n0/1",
        iteration_s=1.0,
        compute_s=1.0,
        wait_s=0.0,
        comm_s=0.0,
        loss=1.0,
        peak_memory_bytes=1.0,
    )
    with pytest.raises(HetplanError, match="produced by another plan"):
        check_log_matches([record], plan, log_file="run.jsonl")


def test_launch_and_report_take_one_median_the_warm_up_step_left_out() -> None:
    """A slow first step and an even number of the others: the two used to differ (2757 vs 2256 ms)."""
    from hetplan.contracts.plan import Pipeline, Plan, Stage
    from hetplan.contracts.runlog import RUNLOG_SCHEMA, parse_record
    from hetplan.local_job import _summary
    from hetplan.views.report import report_rows

    plan = Plan(global_batch=4, pipelines=[Pipeline(4, (4,), (Stage(0, 2, ("n0/0",), (1.0,)),))])
    times = [9.0, 1.0, 2.0, 4.0, 3.0]  # step 0: the warm-up
    records = [
        {"schema": RUNLOG_SCHEMA, "step": k, "rank": 0, "pipeline": 0, "stage": 0, "device": "n0/0", "iteration_s": t,
         "compute_s": t, "wait_s": 0.0, "comm_s": 0.0, "loss": 1.0, "peak_memory_bytes": None}
        for k, t in enumerate(times)
    ]  # fmt: skip
    summary = _summary(plan, records, 1, False)
    rows = report_rows([parse_record(r, file=None, line=i) for i, r in enumerate(records)], plan)
    assert rows["measured_iteration_s"] == 2.5  # the median of steps 1-4
    assert "median iteration 2500.0 ms (1.6 samples/s)" in summary


def test_the_crowding_warning_names_ranks_threads_cores_and_the_likely_step() -> None:
    from hetplan.contracts.plan import Pipeline, Plan, Stage
    from hetplan.local_job import crowding_warning

    stages = tuple(Stage(i, i + 1, (f"n0/{i}",), (1.0,)) for i in range(6))
    plan = Plan(global_batch=6, pipelines=[Pipeline(6, (6,), stages)], predicted={"iteration_s": 0.022})
    assert crowding_warning([plan], threads=1, cores=6) is None
    assert crowding_warning([plan], threads=1, cores=2) == (
        "warning: 6 ranks x 1 thread share this machine's 2 cores: steps will likely take about 3.0x the "
        "predicted 22.0 ms (~66 ms) (docs/benchmarks.md, Runtime)"
    )
    assert "6 ranks x 2 threads share this machine's 4 cores" in (crowding_warning([plan], threads=2, cores=4) or "")


def test_a_device_type_missing_from_a_measured_profile_points_to_estimate_for() -> None:
    """--devices only exists for analytic profiles; a measured one needs --estimate-for."""
    from builders import make_cluster, make_profile

    from hetplan.contracts.model_profile import Timing
    from hetplan.errors import HetplanError

    l4 = make_cluster([("n0", [("L4", 1)])]).devices[0].type
    measured = make_profile(2, times={"cpu": (1.0, 2.0)})
    for block in measured.blocks:
        block.times["cpu"][1] = Timing(fwd=1.0, bwd=2.0, source="measured")
    with pytest.raises(HetplanError) as info:
        measured.time_scale(l4)
    assert "--estimate-for L4" in str(info.value) and "--devices" not in str(info.value)
    analytic = make_profile(2, times={"A100-80GB": (1.0, 2.0)})
    analytic.source["tool"] = "hetplan analytic"
    with pytest.raises(HetplanError, match=r"profile with --analytic --devices L4$"):
        analytic.time_scale(l4)

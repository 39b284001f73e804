"""``hetplan launch`` and ``hetplan report`` end to end on a tiny measured model."""

from __future__ import annotations

import json

import pytest

from hetplan.cli import main


def test_profile_plan_launch_report(tmp_path, capsys) -> None:
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
    for args in steps:
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 0, (args[0], capsys.readouterr().err)
    out = capsys.readouterr().out
    report = json.loads(out[out.index("{") :])
    assert report["steps"] == 3 and report["emulated"]
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

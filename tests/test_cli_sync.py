"""The command line's sync modes and emulated stragglers: ``plan --sync``, ``launch --straggler``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from builders import run_cli as run

ROOT = Path(__file__).resolve().parents[1]
LOCAL2 = str(ROOT / "profiles" / "clusters" / "local-2.yaml")


@pytest.fixture
def profile(tmp_path: Path, capsys) -> str:
    path = str(tmp_path / "p.yaml")
    args = ["profile", "gpt", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "64"]
    code, _, err = run([*args, "--analytic", "--devices", "cpu", "-o", path], capsys)
    assert code == 0, err
    return path


def test_plan_for_a_sync_mode_writes_it_and_simulates_under_it(tmp_path: Path, profile: str, capsys) -> None:
    out = str(tmp_path / "plan.yaml")
    args = ["plan", profile, LOCAL2, "--batch", "16", "--sync", "topk", "--sync-option", "ratio=0.05", "-o", out]
    code, _, err = run(args, capsys)
    assert code == 0, err
    data = yaml.safe_load(Path(out).read_text())
    assert data["sync"] == "topk" and data["sync_options"] == {"ratio": 0.05}
    code, _, err = run(["simulate", out], capsys)
    assert code == 0, err


@pytest.mark.parametrize(
    ("extra", "words"),
    [(["--sync", "wsp", "--sync-option", "bogus=1"], "not bogus"), (["--sync-option", "ratio"], "key=value")],
)
def test_bad_sync_options_get_one_line(tmp_path: Path, profile: str, capsys, extra: list[str], words: str) -> None:
    code, _, err = run(["plan", profile, LOCAL2, "--batch", "16", *extra, "-o", str(tmp_path / "x.yaml")], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and words in lines[0] and "--sync" in lines[0]


def test_a_straggler_needs_emulation_and_a_device_of_the_plan(tmp_path: Path, profile: str, capsys) -> None:
    out = str(tmp_path / "plan.yaml")
    assert run(["plan", profile, LOCAL2, "--batch", "16", "-o", out], capsys)[0] == 0
    for extra, words in [([], "--emulate"), (["--emulate", "--straggler", "x/9:2x@1"], "not in the plan")]:
        flag = [] if extra else ["--straggler", "local/1:2x@1"]
        code, _, err = run(["launch", out, "--steps", "1", *flag, *extra], capsys)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and words in lines[0], err


def test_compare_puts_the_sync_modes_side_by_side(tmp_path: Path, profile: str, capsys) -> None:
    out = str(tmp_path / "plan.yaml")
    assert run(["plan", profile, LOCAL2, "--batch", "16", "-o", out], capsys)[0] == 0
    code, text, err = run(["compare", out, "--sync-modes", "--sync-option", "ratio=0.5"], capsys)
    assert code == 0, err
    for mode in ("allreduce (the plan's)", "wsp", "sdpipe", "adasum", "topk", "ratio 0.5", "no simulator knows"):
        assert mode in text
    code, _, err = run(["compare", out, "--sync-modes", "--sync-option", "bogus=1"], capsys)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "bogus" in lines[0] and "--sync-option" in lines[0]


def test_launch_two_plans_runs_both_jobs_with_a_log_each(tmp_path: Path, profile: str, capsys) -> None:
    plans = [str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]
    for out, batch in zip(plans, ("16", "8"), strict=True):
        assert run(["plan", profile, LOCAL2, "--batch", batch, "-o", out], capsys)[0] == 0
    log = tmp_path / "run.jsonl"
    code, out, err = run(["launch", *plans, "--steps", "3", "--log", str(log)], capsys)
    assert code == 0, err
    assert "job a" in out and "job b" in out and "together" in out
    for name in ("run-a.jsonl", "run-b.jsonl"):
        steps = [ln for ln in (tmp_path / name).read_text().splitlines() if '"step"' in ln]
        assert len(steps) >= 3

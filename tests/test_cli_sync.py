"""The command line's sync modes and emulated stragglers: ``plan --sync``, ``launch --straggler``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hetplan.cli import main

ROOT = Path(__file__).resolve().parents[1]
LOCAL2 = str(ROOT / "profiles" / "clusters" / "local-2.yaml")


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return (0 if exc.value.code is None else exc.value.code), out, err


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

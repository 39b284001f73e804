"""``hetplan calibrate`` through the real command line: one-line errors, and files the other commands take."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from calib_synth import TRUTH, write_case
from click.testing import CliRunner, Result

import hetplan.cli as cli
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml


@click.command(context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
def hetplan(argv: tuple[str, ...]) -> None:
    """The installed entry point (``hetplan.cli:main``: errors become one line and exit code 2), for CliRunner."""
    cli.main(list(argv))


def run(*args: Any) -> Result:
    return CliRunner().invoke(hetplan, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return write_case(tmp_path_factory.mktemp("case"), TRUTH, names=["pipe-cross", "pipe-n0", "dp-cross"])


def _one_line_error(result: Result, *parts: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for part in parts:
        assert part in lines[0], (part, lines[0])
    assert "Traceback" not in result.output


def _bad_plan(folder: Path, name: str, stages: tuple[Stage, ...]) -> str:
    Plan(
        global_batch=2,
        pipelines=[Pipeline(2, (1, 1), stages)],
        inputs={"profile": {"path": "profile.yaml"}, "cluster": {"path": "cluster.yaml"}},
    ).save(folder / name)
    return name


BAD_RUNS: dict[str, tuple[Any, tuple[str, ...]]] = {
    "unknown key": (
        {"plan": "pipe-n0.yaml", "iteration_s": 1.0, "iteraton_s": 2},
        ("runs[0].iteraton_s", "unknown field"),
    ),
    "missing plan": ({"plan": "nope.yaml", "iteration_s": 1.0}, ("runs[0].plan", "no such file")),
    "typo without the right key": ({"plan": "pipe-n0.yaml", "iteraton_s": 2}, ("runs[0].iteraton_s", "did you mean")),
    "plan misspelt": ({"plna": "pipe-n0.yaml", "iteration_s": 1.0}, ("runs[0].plan", "found 'plna' (a typo?)")),
    "missing run log": ({"plan": "pipe-n0.yaml", "run_log": "nope.jsonl"}, ("runs[0].run_log", "no such file")),
    "no plan": ({"iteration_s": 1.0}, ("runs[0].plan", "missing required field")),
    "time twice": (
        {"plan": "pipe-n0.yaml", "run_log": "pipe-n0.jsonl", "iteration_s": 1.0},
        ("runs[0].iteration_s", "not both"),
    ),
    "no time": ({"plan": "pipe-n0.yaml"}, ("runs[0]", "iteration_s", "run_log")),
    "negative time": ({"plan": "pipe-n0.yaml", "iteration_s": -1.0}, ("runs[0].iteration_s", "positive")),
    "time as text": ({"plan": "pipe-n0.yaml", "iteration_s": "fast"}, ("runs[0].iteration_s", "expected a number")),
    "bad size": (
        {"plan": "pipe-n0.yaml", "iteration_s": 1.0, "peak_memory": {"n0/0": "11.2Gb"}},
        ("runs[0].peak_memory.n0/0", "expected a size"),
    ),
    "bad address": (
        {"plan": "pipe-n0.yaml", "iteration_s": 1.0, "peak_memory": {"gpu0": "11GiB"}},
        ("runs[0].peak_memory.gpu0", "NODE/INDEX"),
    ),
    "memory of a device the plan does not use": (
        {"plan": "pipe-n0.yaml", "iteration_s": 1.0, "peak_memory": {"n1/1": "11GiB"}},
        ("bad-memory-of", "runs[0].peak_memory.n1/1", "not used by plan pipe-n0.yaml"),
    ),
    "log of another plan": (
        {"plan": "pipe-cross.yaml", "run_log": "pipe-n0.jsonl"},
        ("pipe-n0.jsonl", "rank 1", "another plan"),
    ),
    "plan on a device the cluster lacks": (
        {"plan": "@device", "iteration_s": 1.0},
        ("bad-device.yaml", "pipelines[0].stages[1].devices[0]", "no device 'n2/0'"),
    ),
    "plan whose blocks do not match the profile": (
        {"plan": "@blocks", "iteration_s": 1.0},
        ("bad-blocks.yaml", "pipelines[0].stages[1].blocks", "profile has 6 blocks"),
    ),
}


@pytest.mark.parametrize("what", list(BAD_RUNS))
def test_bad_measurements_give_one_located_line(case: tuple[Path, Path, Path], tmp_path: Path, what: str) -> None:
    profile, cluster, measured = case
    folder = measured.parent
    run_entry, parts = BAD_RUNS[what]
    run_entry = dict(run_entry)
    if run_entry.get("plan") == "@device":
        run_entry["plan"] = _bad_plan(
            folder, "bad-device.yaml", (Stage(0, 3, ("n0/0",), (1.0,)), Stage(3, 6, ("n2/0",), (1.0,)))
        )
    elif run_entry.get("plan") == "@blocks":
        run_entry["plan"] = _bad_plan(
            folder, "bad-blocks.yaml", (Stage(0, 3, ("n0/0",), (1.0,)), Stage(3, 5, ("n0/1",), (1.0,)))
        )
    bad = folder / f"bad-{what.replace(' ', '-')}.yaml"
    write_yaml({"schema": "hetplan/measurements/v1", "runs": [run_entry]}, bad)
    _one_line_error(run("calibrate", profile, cluster, bad, "-o", tmp_path / "out"), *parts)
    assert not (tmp_path / "out").exists()  # nothing written on a bad input


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("schema: hetplan/measurement/v1\nruns: []\n", ("schema", "expected schema hetplan/measurements/v1")),
        ("schema: hetplan/measurements/v1\nruns: []\n", ("runs", "non-empty list")),
        ("schema: hetplan/measurements/v1\nruns: [3]\n", ("runs[0]", "expected a mapping")),
        ("schema: hetplan/measurements/v1\nrun: []\n", ("runs", "missing required field")),
        ("", ("empty file",)),
        (
            "schema: hetplan/measurements/v1\nruns:\n- {plan: pipe-n0.yaml, iteration_s: 1, name: a}\n"
            "- {plan: pipe-n0.yaml, iteration_s: 2, name: a}\n",
            ("runs[1].name", "duplicate run name 'a'"),
        ),
    ],
    ids=["schema", "no runs", "run not a mapping", "typo at the top", "empty", "duplicate names"],
)
def test_bad_measurement_files(
    case: tuple[Path, Path, Path], tmp_path: Path, text: str, parts: tuple[str, ...]
) -> None:
    profile, cluster, measured = case
    bad = measured.parent / "bad-file.yaml"
    bad.write_text(text)
    _one_line_error(run("calibrate", profile, cluster, bad, "-o", tmp_path / "out"), "bad-file.yaml", *parts)


def test_bad_run_log_line(case: tuple[Path, Path, Path], tmp_path: Path) -> None:
    profile, cluster, measured = case
    folder = measured.parent
    (folder / "broken.jsonl").write_text("{not json\n")
    bad = folder / "bad-log.yaml"
    write_yaml(
        {"schema": "hetplan/measurements/v1", "runs": [{"plan": "pipe-n0.yaml", "run_log": "broken.jsonl"}]}, bad
    )
    _one_line_error(
        run("calibrate", profile, cluster, bad, "-o", tmp_path / "out"), "broken.jsonl", "line 1", "not JSON"
    )


def test_calibrated_pair_works_with_simulate_plan_and_compare(case: tuple[Path, Path, Path], tmp_path: Path) -> None:
    profile, cluster, measured = case
    out = tmp_path / "calibrated"
    result = run("calibrate", profile, cluster, measured, "-o", out, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert {p["name"] for p in report["parameters"] if p["identified"]} >= {"compute[A100-80GB]", "compute[V100-16GB]"}
    after = {r["name"]: r["predicted_after_s"] for r in report["runs"]}

    # simulate a measured plan with the calibrated pair: the figure calibrate reported
    plan_file = measured.parent / "pipe-cross.yaml"
    sim = run("simulate", plan_file, "--profile", out / "profile.yaml", "--cluster", out / "cluster.yaml", "--json")
    assert sim.exit_code == 0, sim.output
    assert json.loads(sim.stdout)["iteration_s"] == pytest.approx(after["pipe-cross.jsonl"], rel=1e-9)

    # plan on the calibrated pair, then show it against the baselines and simulate it
    planned = tmp_path / "plan.yaml"
    made = run("plan", out / "profile.yaml", out / "cluster.yaml", "--batch", 4, "-o", planned)
    assert made.exit_code == 0, made.output
    assert yaml.safe_load(planned.read_text())["inputs"]["cluster"]["path"].endswith("cluster.yaml")
    assert run("compare", planned).exit_code == 0
    assert run("simulate", planned).exit_code == 0

    # the table form names what was identified and what stayed at the prior
    table = run("calibrate", profile, cluster, measured, "-o", tmp_path / "again")
    assert table.exit_code == 0, table.output
    assert "identified" in table.stdout and "prior" in table.stdout
    assert "leave-one-out" in table.stdout
    assert (tmp_path / "again" / "cluster.yaml").read_bytes() == (out / "cluster.yaml").read_bytes()

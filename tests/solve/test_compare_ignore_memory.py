"""`hetplan compare --ignore-memory`: a --with plan the memory check refuses is timed, and each
device's excess over its capacity is shown (text and JSON)."""

from __future__ import annotations

import json
from pathlib import Path

from builders import linear_plan, make_profile
from click.testing import CliRunner

from hetplan.cli import cli
from hetplan.contracts.yamlio import write_yaml

A100 = "A100-80GB"


def _files(tmp_path: Path) -> tuple[Path, Path]:
    """A plan on two A100s that fits (48 GB each with Adam) and one on a single A100 that does not (96 GB)."""
    profile = make_profile(2, times={A100: (1.0, 1.0)}, params=3_000_000_000)  # per block
    profile.save(tmp_path / "profile.yaml")
    write_yaml(
        {
            "schema": "hetplan/cluster/v1",
            "name": "one",
            "nodes": [{"name": "n0", "devices": [{"type": A100, "count": 2}], "link": {"bandwidth": "100GB/s"}}],
            "network": {"bandwidth": "10GB/s"},
        },
        tmp_path / "cluster.yaml",
    )
    inputs = {"profile": {"path": "profile.yaml"}, "cluster": {"path": "cluster.yaml"}}
    fits = linear_plan(["n0/0", "n0/1"], 2, [1], optimizer="adam")
    fits.inputs = inputs
    fits.save(tmp_path / "plan.yaml")
    big = linear_plan(["n0/0"], 2, [1], optimizer="adam")
    big.inputs = {key: {"path": f"../{value['path']}"} for key, value in inputs.items()}
    (tmp_path / "big").mkdir()
    big.save(tmp_path / "big" / "plan.yaml")
    return tmp_path / "plan.yaml", tmp_path / "big" / "plan.yaml"


def test_compare_times_refused_plans_with_the_flag(tmp_path: Path) -> None:
    plan, big = _files(tmp_path)
    runner = CliRunner()
    plain = runner.invoke(cli, ["compare", str(plan), "--with", str(big), "--json"], catch_exceptions=False)
    assert plain.exit_code == 0, plain.output
    row = json.loads(plain.output)[-1]  # the --with plan comes last
    assert row["iteration_s"] is None and "over" not in row

    flagged = runner.invoke(
        cli, ["compare", str(plan), "--with", str(big), "--ignore-memory", "--json"], catch_exceptions=False
    )
    assert flagged.exit_code == 0, flagged.output
    rows = {r["name"]: r for r in json.loads(flagged.output)}
    assert rows["hetplan"]["over"] == {}
    timed = rows[row["name"]]
    assert timed["iteration_s"] > 0 and timed["speedup"] > 0
    assert set(timed["over"]) == {"n0/0"}
    assert timed["over"]["n0/0"] > 10e9  # 96 GB of weights, gradients and Adam state on an 80 GiB part

    text = runner.invoke(cli, ["compare", str(plan), "--with", str(big), "--ignore-memory"], catch_exceptions=False)
    assert text.exit_code == 0, text.output
    assert f"{row['name']}: n0/0 is" in text.output and "over its memory" in text.output

"""`hetplan simulate --ignore-memory`: a plan the memory check refuses is timed, each device's excess shown."""

from __future__ import annotations

import json
from pathlib import Path

from builders import linear_plan, make_profile, run_cli

from hetplan.contracts.yamlio import write_yaml

A100 = "A100-80GB"


def _files(tmp_path: Path) -> Path:
    profile = make_profile(2, times={A100: (1.0, 1.0)}, params=10_000_000_000)  # 160 GB with Adam
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
    plan = linear_plan(["n0/0", "n0/1"], 2, [1], optimizer="adam")
    plan.inputs = {"profile": {"path": "profile.yaml"}, "cluster": {"path": "cluster.yaml"}}
    plan.save(tmp_path / "plan.yaml")
    return tmp_path / "plan.yaml"


def test_refused_without_the_flag_timed_with_it(tmp_path: Path, capsys) -> None:
    plan = str(_files(tmp_path))
    code, out, err = run_cli(["simulate", plan], capsys)
    assert code == 2 and "does not fit on n0/0" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_cli(["simulate", plan, "--ignore-memory"], capsys)
    assert code == 0, err
    assert "memory check ignored: 2 of 2 devices over capacity" in " ".join(out.split())
    assert "over" in out and "NO" in out
    code, out, err = run_cli(["simulate", plan, "--ignore-memory", "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["iteration_s"] > 0
    for d in data["devices"].values():
        assert not d["memory_fits"]
        assert d["over_bytes"] == d["peak_memory_bytes"] - d["capacity_bytes"] > 0

"""A plan written by hand, with only DESIGN.md's minimal keys, simulates from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetplan.cli import main

ROOT = Path(__file__).resolve().parents[2]

PROFILE = """\
schema: hetplan/model-profile/v1
model: {name: hand}
dtype: fp32
blocks:
"""

PLAN = """\
schema: hetplan/plan/v1
inputs: {profile: {path: profile.yaml}, cluster: {path: ../../profiles/clusters/mixed-small.yaml}}
global_batch: 12
pipelines:
  - batch: 8
    micro_batches: [2, 2, 4]
    stages:
      - {blocks: [0, 2], devices: [node0/0]}
      - {blocks: [2, 4], devices: [node1/0, node1/1], shares: [0.5, 0.5]}
  - batch: 4
    micro_batches: [4]
    stages:
      - {blocks: [0, 4], devices: [node0/1]}
"""


def _profile_text() -> str:
    lines = [PROFILE]
    for i in range(4):
        lines.append(f"""\
  - name: b{i}
    params: 1000
    activation_bytes: 1000
    output_bytes: 1000
    time:
      A100-80GB: {{1: {{fwd: 0.001, bwd: 0.002}}}}
      V100-16GB: {{1: {{fwd: 0.002, bwd: 0.004}}}}
      T4: {{1: {{fwd: 0.006, bwd: 0.012}}}}
""")
    return "".join(lines)


def test_a_minimal_hand_written_plan_simulates(tmp_path, capsys) -> None:
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    (folder / "profile.yaml").write_text(_profile_text())
    plan = folder / "plan.yaml"
    plan.write_text(PLAN.replace("../../profiles", str(ROOT / "profiles")))
    with pytest.raises(SystemExit) as info:
        main(["simulate", str(plan), "--json"])
    assert info.value.code == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["iteration_s"] > 0 and out["samples_per_s"] > 0 and 0 <= out["bubble_fraction"] < 1
    assert set(out["devices"]) == {"node0/0", "node0/1", "node1/0", "node1/1"}
    with pytest.raises(SystemExit) as info:
        main(["simulate", str(plan), "--timeline", str(tmp_path / "t.svg"), "--trace", str(tmp_path / "t.json")])
    assert info.value.code == 0
    assert (tmp_path / "t.svg").read_text().lstrip().startswith("<svg")
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]

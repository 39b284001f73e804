"""The worked example of docs/train-your-own-model.md, run as the page writes it.

The page's ``python title=FILE`` blocks are written to a scratch folder and its ``bash example``
block is run there by bash with the installed ``hetplan`` first on PATH (and the repository's
``profiles/`` beside it): a page whose example stops working fails this test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hetplan.contracts.model_profile import load_profile

pytest.importorskip("transformers", reason="the example trains a Hugging Face GPT-2 (pip install '.[hf]')")

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "train-your-own-model.md"
BLOCK = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```$", re.S | re.M)


def _blocks() -> tuple[dict[str, str], str]:
    files, script = {}, None
    for m in BLOCK.finditer(PAGE.read_text()):
        info = m["info"].split()
        if info[:1] == ["python"] and len(info) > 1 and info[1].startswith("title="):
            files[info[1].removeprefix("title=")] = m["body"]
        elif info == ["bash", "example"]:
            script = m["body"]
    assert files and script, "the page lost its worked example"
    return files, script


def test_the_worked_example_runs_and_trains(tmp_path) -> None:
    files, script = _blocks()
    for name, body in files.items():
        (tmp_path / name).write_text(body)
    (tmp_path / "profiles").symlink_to(ROOT / "profiles")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=540
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads(line) for line in (tmp_path / "run.jsonl").read_text().splitlines() if line.strip()]
    rank0 = [r["loss"] for r in records if r.get("rank") == 0 and "loss" in r]
    assert len(rank0) == 3 and rank0[-1] < rank0[0]
    profile = load_profile(tmp_path / "gpt2.yaml")
    assert profile.model["hf"] == "gpt2"
    head = profile.blocks[-1]
    assert (head.name, head.params) == ("head", 64)  # its final LayerNorm: the tied LM head counted once

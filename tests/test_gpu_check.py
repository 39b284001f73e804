"""benchmarks/gpu_check.py in its CPU mode: every kind of section runs here (the GPU run takes the
same code paths with CUDA and NCCL), results land as JSON and markdown, a hung section is stopped
and recorded, and sections past the time budget are skipped, not lost."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from hetplan.contracts import load_cluster
from hetplan.contracts.model_profile import load_profile

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
#: One section of each kind (the others differ only in dtype, plan shape or sync mode).
KINDS = "environment,probe,profile-fp16,nccl-collectives,train-2pipe-bf16,sync-topk,nccl-runtime"


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gpu_check", module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)


def test_cpu_mode_runs_one_section_of_each_kind(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    proc = _run("--cpu", "--out", str(out), "--work", str(work), "--sections", KINDS, timeout=2400)
    report = json.loads((out / "benchmarks" / "results" / "gpu_check-cpu.json").read_text())
    sections = {r["section"]: r for r in report["sections"]}
    failed = {k: (r.get("error"), r.get("log_tail", [])[-3:]) for k, r in sections.items() if r["status"] != "pass"}
    assert not failed, failed
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert sorted(sections) == sorted(KINDS.split(",")) and report["mode"] == "cpu"
    # probe: a node entry that validates
    (work / "node.yaml").write_text(sections["probe"]["figures"]["node_entry"])
    assert load_cluster(work / "node.yaml").devices
    # profile: saved where profiles live, with the analytic estimate's error per block
    profile = load_profile(out / "profiles" / "models" / "gpt-tiny-fp16.cpu.yaml")
    assert profile.dtype == "fp16"
    [errors] = [t for t in sections["profile-fp16"]["tables"] if "analytic" in t["title"]]
    assert len(errors["rows"]) == len(profile.blocks)
    # training: ranks against one process and the reference; peak memory per rank beside the prediction
    train = sections["train-2pipe-bf16"]["figures"]
    assert train["max_loss_diff_one_process"] <= 1e-3 and train["max_loss_diff_reference"] <= 1e-3
    assert [m["rank"] for m in train["memory"]] == [0, 1]
    assert all(len(sections[s]["figures"]["losses"]) >= 3 for s in ("sync-topk", "train-2pipe-bf16"))
    [calls] = sections["nccl-collectives"]["tables"]
    assert sum(row[1] == "ok" for row in calls["rows"]) >= 9
    # what comes back from a GPU machine is limited: the run writes few files under --out
    written = [p for p in out.rglob("*") if p.is_file()]
    assert len(written) <= 8, written
    markdown = (out / "benchmarks" / "results" / "gpu_check-cpu.md").read_text()
    assert "| train-2pipe-bf16 | pass |" in markdown


def test_a_section_past_its_limit_is_stopped_and_recorded(tmp_path: Path) -> None:
    check = _load_script()
    env = dict(os.environ, PYTHONPATH=str(check._shim(tmp_path)), CUDA_VISIBLE_DEVICES="")
    section = next(s for s in check.SECTIONS if s.name == "train-2stage-fp16")
    began = time.perf_counter()
    record = check.run_section(section, limit=2.0, python=sys.executable, env=env, work=tmp_path, out=tmp_path,
                               cpu=True)  # fmt: skip
    assert time.perf_counter() - began < 2.0 + check.TERM_GRACE_S + 10
    assert record["status"] == "fail" and record["error"] == "timed out after 2 s"
    report = {"mode": "cpu", "device_type": "cpu", "command": "x", "host": "h", "started": "t", "seconds": 2.0,
              "budget_s": 2.0, "sections": [record]}  # fmt: skip
    assert "| train-2stage-fp16 | fail |" in check.markdown(report)
    assert "fail" in check.summary_text(report)


def test_sections_past_the_budget_are_skipped_and_bad_names_refused(tmp_path: Path) -> None:
    proc = _run("--cpu", "--out", str(tmp_path), "--budget", "1", "--sections", "probe,sync-wsp", timeout=60)
    assert proc.returncode == 1
    report = json.loads((tmp_path / "benchmarks" / "results" / "gpu_check-cpu.json").read_text())
    assert [(r["section"], r["status"]) for r in report["sections"]] == [("probe", "skipped"), ("sync-wsp", "skipped")]
    bad = _run("--cpu", "--out", str(tmp_path), "--sections", "probe,nope", timeout=60)
    assert bad.returncode == 2 and "unknown nope" in bad.stdout


def test_every_section_has_a_function_and_the_budget_fits_eight_minutes() -> None:
    check = _load_script()
    assert set(check._section_functions()) == set(check.SECTION_NAMES)
    # the last section may start just inside the budget and then run its whole limit, plus the grace
    longest = max(s.gpu_limit_s for s in check.SECTIONS)
    assert check.DEFAULT_BUDGET_S + check.TERM_GRACE_S + 10 < 8 * 60
    assert longest < check.DEFAULT_BUDGET_S

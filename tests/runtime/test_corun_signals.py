"""Signals to a co-run, ``hetplan launch a.yaml b.yaml`` (a ``kill``, a Ctrl-C, a closed terminal):
every rank of both jobs stops within seconds, both run logs so far are written, no process remains
(checked by pid: both agents and every worker) and the exit code is 128 + the signal.

As ``tests/runtime/test_signals.py`` does for one job: the real command in a process of its own,
its temporary folder (``TMPDIR``) in the test's folder, so that both run folders, the workers' pids
and their progress can be read.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import zoo_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.runlog import load_run_log
from hetplan.contracts.yamlio import write_yaml

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "profiles" / "clusters" / "local-2.yaml"
GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
MLP = {"family": "mlp", "config": {"layers": 3, "width": 64, "input": 32, "classes": 10}}

#: The command as a user's shell starts it: the stop signals at their defaults (a test runner may
#: have been started with SIGINT or SIGHUP ignored, which a child would inherit).
ENTRY = (
    "import signal, sys; [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP)]; "
    "from hetplan.cli import main; main(sys.argv[1:])"
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")


def _plans(folder: Path) -> tuple[Path, Path]:
    """Job a: a two-stage GPT pipeline; job b: an MLP data-parallel on the same two devices."""
    write_yaml(zoo_profile(GPT).to_dict(), folder / "gpt.yaml")
    write_yaml(zoo_profile(MLP).to_dict(), folder / "mlp.yaml")
    n_mlp = len(zoo_profile(MLP).blocks)
    stages = (Stage(0, 3, ("local/0",), (1.0,)), Stage(3, 6, ("local/1",), (1.0,)))
    pipe = Plan(global_batch=8, pipelines=[Pipeline(8, (4, 4), stages)], optimizer="adam")
    dp = Plan(
        global_batch=8,
        pipelines=[Pipeline(4, (2, 2), (Stage(0, n_mlp, (f"local/{d}",), (1.0,)),)) for d in (0, 1)],
        optimizer="sgd",
    )
    paths = []
    for name, plan, profile in (("a", pipe, "gpt.yaml"), ("b", dp, "mlp.yaml")):
        data = plan.to_dict()
        data["inputs"] = {"profile": {"path": str(folder / profile)}, "cluster": {"path": str(CLUSTER)}}
        write_yaml(data, folder / f"plan-{name}.yaml")
        paths.append(folder / f"plan-{name}.yaml")
    return paths[0], paths[1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _trained(tmp: Path) -> bool:
    """Both jobs' run folders exist, every rank has said who it is, and each rank 0 finished 2 steps."""
    runs = list(tmp.glob("hetplan-run-*"))
    if len(runs) != 2:
        return False
    for run in runs:
        if len(list((run / "ranks").glob("rank-*.json"))) < 2:
            return False
        log = run / "rank-0.jsonl"
        if not log.exists() or log.read_text().count("\n") < 2:
            return False
    return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_to_a_corun_stops_both_jobs_writes_both_logs_and_leaves_no_process(tmp_path, sig) -> None:
    plan_a, plan_b = _plans(tmp_path)
    log, tmp = tmp_path / "run.jsonl", tmp_path / "tmp"
    tmp.mkdir()
    env = dict(
        os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    argv = ["launch", str(plan_a), str(plan_b), "--steps", "100000", "--log", str(log)]
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test's own process group is never signalled
    )
    try:
        end = time.time() + 300
        while not _trained(tmp):
            if proc.poll() is not None:
                pytest.fail(f"launch ended early ({proc.returncode}): {proc.stderr.read()}")
            if time.time() > end:
                pytest.fail("no steps within the time given (the machine may be overloaded)")
            time.sleep(0.2)
        workers = [json.loads(p.read_text())["pid"] for p in tmp.glob("hetplan-run-*/ranks/rank-*.json")]
        agents = {_parent(pid) for pid in workers}  # each job's torchrun agent
        assert len(workers) == 4 and len(agents) == 2
        os.kill(proc.pid, sig)
        sent = time.time()
        _, err = proc.communicate(timeout=120)
        took = time.time() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert took < 30, took  # seconds: the workers' grace after a signal is 3 s (loaded machines vary)
    lines = [line for line in err.strip().splitlines() if not line.startswith("warning: ")]  # cores shared
    assert len(lines) == 1, err
    assert proc.returncode == 128 + sig, err
    assert lines[0].startswith(f"error: stopped by {sig.name}; every rank of every job has ended; job a: ")
    for name in ("a", "b"):
        job_log = tmp_path / f"run-{name}.jsonl"
        assert f"run log so far: {job_log}" in lines[0]
        records = load_run_log(job_log)  # the steps so far, a valid run log
        assert {r.rank for r in records} == {0, 1} and max(r.step for r in records) >= 1
    assert not [pid for pid in [*workers, *agents] if _alive(pid)]

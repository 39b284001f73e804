"""Signals to ``hetplan launch`` (a ``kill``, a Ctrl-C, a closed terminal) or to the torchrun agent
it started: every rank stops within seconds, the run log so far is written, no process remains
(checked by pid: the agent and every worker), and the exit code is non-zero.

Each test runs the real command in a process of its own, with its temporary folder (``TMPDIR``)
in the test's folder, so that the run folder, the workers' pids and their progress can be read.
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
from hetplan.runtime.launcher import RANK_START_ENV

ROOT = Path(__file__).resolve().parents[2]
GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}

#: The command as a user's shell starts it: the stop signals at their defaults (a test runner may
#: have been started with SIGINT or SIGHUP ignored, which a child would inherit).
ENTRY = (
    "import signal, sys; [signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGHUP)]; "
    "from hetplan.cli import main; main(sys.argv[1:])"
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")


def _plan(folder: Path) -> Path:
    write_yaml(zoo_profile(GPT).to_dict(), folder / "profile.yaml")
    plan = Plan(
        global_batch=8,
        pipelines=[Pipeline(8, (4, 4), (Stage(0, 3, ("local/0",), (1.0,)), Stage(3, 6, ("local/1",), (1.0,))))],
        inputs={
            "profile": {"path": str(folder / "profile.yaml")},
            "cluster": {"path": str(ROOT / "profiles" / "clusters" / "local-2.yaml")},
        },
    )
    write_yaml(plan.to_dict(), folder / "plan.yaml")
    return folder / "plan.yaml"


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first), or None: no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def _alive(pid: int) -> bool:
    fields = _stat(pid)
    return fields is not None and fields[0] != "Z"


def _descendants(root: int) -> set[int]:
    """Every process below ``root`` now (children, theirs, ...)."""
    parent_of = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat(int(stat.parent.name))
        if fields is not None:
            parent_of[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parent_of.items() if parent in frontier} - found
        found |= frontier
    return found


def _gone(pids, *, within: float) -> list[int]:
    """Those of ``pids`` still alive after ``within`` s (a fork server ends once its last client has)."""
    end = time.time() + within
    while (left := [pid for pid in pids if _alive(pid)]) and time.time() < end:
        time.sleep(0.1)
    return left


def _wait_for(what, *, timeout: float, proc: subprocess.Popen) -> None:
    """Wait until ``what()``; fail if the command ends first or it takes longer than ``timeout``."""
    end = time.time() + timeout
    while not what():
        if proc.poll() is not None:
            pytest.fail(f"launch ended early ({proc.returncode}): {proc.stderr.read()}")
        if time.time() > end:
            proc.kill()
            pytest.fail("no step within the time given (the machine may be overloaded)")
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("target", "sig", "rank_start"),
    [
        ("launch", signal.SIGTERM, "forkserver"),
        ("launch", signal.SIGHUP, "forkserver"),
        ("launch", signal.SIGINT, "forkserver"),
        ("agent", signal.SIGTERM, "forkserver"),
        # a closed terminal: SIGHUP to the launch's whole process group, the launch's fork server
        # (which reports the forked agent's exit code) included, not the agent (a session of its own)
        ("group", signal.SIGHUP, "forkserver"),
        # torchrun's default start (a fresh Python per rank), what runs across machines: the same behaviour
        ("launch", signal.SIGTERM, "spawn"),
        ("agent", signal.SIGTERM, "spawn"),
    ],
)
def test_a_signal_stops_every_rank_writes_the_log_and_leaves_no_process(tmp_path, target, sig, rank_start) -> None:
    plan, log, tmp = _plan(tmp_path), tmp_path / "run.jsonl", tmp_path / "tmp"
    tmp.mkdir()
    env = dict(
        os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    env[RANK_START_ENV] = rank_start
    argv = ["launch", str(plan), "--steps", "100000", "--log-every", "1000", "--log", str(log)]
    proc = subprocess.Popen(
        [sys.executable, "-c", ENTRY, *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test's own process group is never signalled
    )
    try:

        def trained() -> bool:  # both workers have said who they are and rank 0 finished 2 steps
            runs = list(tmp.glob("hetplan-run-*"))
            if not runs or len(list((runs[0] / "ranks").glob("rank-*.json"))) < 2:
                return False
            lines = (runs[0] / "rank-0.jsonl").read_text() if (runs[0] / "rank-0.jsonl").exists() else ""
            return lines.count("\n") >= 2

        _wait_for(trained, timeout=300, proc=proc)
        (run,) = tmp.glob("hetplan-run-*")
        workers = [json.loads(p.read_text())["pid"] for p in (run / "ranks").glob("rank-*.json")]
        agent = int((run / "agent.pid").read_text())  # the launch's child, or its fork server's
        below = _descendants(proc.pid)  # the agent, fork servers, resource trackers, ranks
        assert agent in below and set(workers) <= below, (agent, workers, below)
        if target == "group":
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid if target == "launch" else agent, sig)
        sent = time.time()
        _, err = proc.communicate(timeout=120)
        took = time.time() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took < 30, took  # seconds: the workers' grace after a signal is 3 s (loaded machines vary)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    if target in ("launch", "group"):
        assert proc.returncode == 128 + sig, err
        assert lines[0].startswith(f"error: stopped by {sig.name} after ")
        assert f"; every rank has ended; run log so far: {log}" in lines[0]
    else:
        assert proc.returncode == 128 + sig, err
        assert lines[0].startswith(f"error: the run stopped: torchrun's agent got {sig.name} and stopped every rank")
    records = load_run_log(log)  # the steps so far, a valid run log
    assert {r.rank for r in records} == {0, 1} and max(r.step for r in records) >= 1
    assert not _gone([*workers, agent], within=0.0)
    assert not _gone(below, within=5.0)

"""Spawn every rank of a plan on this machine (gloo), watch them, and merge their run logs.

    result = launch_local("launch/rank-config.yaml", steps=20, log="run.jsonl")

A rank that exits non-zero stops the job: the launcher gives the others a moment to report what
they were waiting on, then ends every rank (no orphans: each rank runs in its own process group,
and the whole group is killed), and raises one error naming the ranks, steps and actions.
A job that makes no progress for the rank timeout plus a margin is stopped the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from planner.errors import HetplanError
from planner.runtime.config import load_rank_config

__all__ = ["LaunchResult", "launch_local"]

GRACE_S = 3.0


@dataclass
class LaunchResult:
    records: list[dict]
    wall_s: float
    log: Path | None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
    deadline = time.time() + 2.0
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _last_error(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    errors = [ln for ln in lines if ln.startswith("error: ")]
    return errors[-1][len("error: ") :] if errors else (lines[-1] if lines else "")


def launch_local(
    config_path: str | Path,
    *,
    steps: int,
    log: str | Path | None = None,
    emulate: bool = False,
    save: str | Path | None = None,
    resume: str | Path | None = None,
    threads: int = 1,
    progress: Callable[[int, int], None] | None = None,
    kill_rank_after: tuple[int, float] | None = None,
    blocking_allreduce: bool = False,
) -> LaunchResult:
    """Run ``steps`` steps with every rank here; ``kill_rank_after=(rank, seconds)`` is for fault tests."""
    config = load_rank_config(config_path)
    addresses = list(config.devices)
    world = len(addresses)
    work = Path(tempfile.mkdtemp(prefix="hetplan-run-"))
    port = _free_port()
    root = Path(__file__).resolve().parents[2]
    env_base = dict(os.environ)
    env_base.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": "0",
            "OMP_NUM_THREADS": str(threads),
            "PYTHONPATH": os.pathsep.join([str(root), env_base.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        }
    )
    procs: list[subprocess.Popen] = []
    start = time.time()
    for rank, address in enumerate(addresses):
        env = dict(env_base, RANK=str(rank))
        cmd = [
            sys.executable,
            "-m",
            "planner.runtime.worker",
            str(config_path),
            "--device",
            address,
            "--steps",
            str(steps),
            "--log",
            str(work / f"rank-{rank}.jsonl"),
            "--backend",
            "gloo",
            "--threads",
            str(threads),
        ]
        if emulate:
            cmd.append("--emulate")
        if blocking_allreduce:
            cmd.append("--blocking-allreduce")
        if save:
            cmd += ["--save", str(save)]
        if resume:
            cmd += ["--resume", str(resume)]
        stderr = open(work / f"rank-{rank}.err", "w", encoding="utf-8")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True))
        stderr.close()
    stall_limit = config.timeout_s + 30.0
    last_progress, last_count = time.time(), -1
    failed_at: float | None = None
    killed = False
    try:
        while True:
            codes = [p.poll() for p in procs]
            if kill_rank_after and not killed and time.time() - start > kill_rank_after[1]:
                os.killpg(procs[kill_rank_after[0]].pid, signal.SIGKILL)
                killed = True
            count = _count_lines(work / "rank-0.jsonl")
            if count != last_count:
                last_count, last_progress = count, time.time()
                if progress:
                    progress(count, steps)
            if all(c == 0 for c in codes):
                break
            if any(c not in (None, 0) for c in codes) and failed_at is None:
                failed_at = time.time()
            if failed_at is not None and (time.time() - failed_at > GRACE_S or all(c is not None for c in codes)):
                raise HetplanError(_failure_message(procs, codes, addresses, work, steps))
            if time.time() - last_progress > stall_limit:
                raise HetplanError(
                    f"no step finished for {stall_limit:.0f} s; stopped every rank "
                    f"(last step logged: {last_count - 1}); "
                    + _failure_message(procs, [p.poll() for p in procs], addresses, work, steps)
                )
            time.sleep(0.1)
    finally:
        _kill(procs)
    records = []
    for rank in range(world):
        path = work / f"rank-{rank}.jsonl"
        if path.is_file():
            records += [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    records.sort(key=lambda r: (r["step"], r["rank"]))
    target = Path(log) if log else None
    if target:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return LaunchResult(records=records, wall_s=time.time() - start, log=target)


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _failure_message(procs, codes, addresses, work: Path, steps: int) -> str:
    parts = []
    order = sorted(range(len(codes)), key=lambda r: (codes[r] is None or codes[r] >= 0, r))  # the dead first
    for rank in order:
        code = codes[rank]
        if code in (None, 0):
            continue
        reason = _last_error(work / f"rank-{rank}.err")
        if code < 0:
            parts.append(f"rank {rank} ({addresses[rank]}) died ({signal.Signals(-code).name})")
        elif reason:
            parts.append(reason if reason.startswith("rank ") else f"rank {rank} ({addresses[rank]}): {reason}")
        else:
            parts.append(f"rank {rank} ({addresses[rank]}) exited with code {code}")
    for rank, _p in enumerate(procs):
        if codes[rank] is None:
            reason = _last_error(work / f"rank-{rank}.err")
            if reason:
                parts.append(reason)
    return "the run stopped: " + "; ".join(dict.fromkeys(parts)) if parts else "the run stopped"

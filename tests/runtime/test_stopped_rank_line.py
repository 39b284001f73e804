"""What a rank stopped from outside says, and when the launcher's one line names it.

torchrun's agent ends the other ranks with SIGTERM once one fails; each then has a grace to report
its own failure (a receive from a dead peer fails within milliseconds). One that is still blocked
when the grace ends names the transfer or collective it waits on, and that line reaches the rank's
log even while the CPU memory measurement has pointed descriptor 2 at /dev/null.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from hetplan.runtime import comm
from hetplan.runtime.launcher import _failure_message

ROOT = Path(__file__).resolve().parents[2]


class _Work:
    """A work whose wait records what :func:`comm.waiting_on` said while it was waited on."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.seen = fail, None

    def wait(self, timeout=None) -> bool:
        self.seen = comm.waiting_on()
        if self.fail:
            raise RuntimeError("Connection closed by peer [127.0.0.1]:1")
        return True


def test_a_wait_names_what_it_waits_on_only_while_it_waits() -> None:
    work = _Work()
    assert comm.waiting_on() is None
    comm.wait(work, timeout_s=1.0, what="rank 0 (n0/0) step 3: waiting on SA1>n0/1")
    assert work.seen == "rank 0 (n0/0) step 3: waiting on SA1>n0/1"
    assert comm.waiting_on() is None
    failing = _Work(fail=True)
    try:
        comm.wait(failing, timeout_s=1.0, what="rank 0 (n0/0) step 3: waiting on RG0<n0/1")
    except comm.RankFailureError as exc:
        assert str(exc) == "rank 0 (n0/0) step 3: waiting on RG0<n0/1: Connection closed by peer [127.0.0.1]:1"
    assert failing.seen.endswith("RG0<n0/1") and comm.waiting_on() is None


def test_a_rank_stopped_while_blocked_names_the_wait_even_with_stderr_quietened(tmp_path: Path) -> None:
    """The worker's SIGTERM watcher, in a process of its own: blocked "in a wait" while descriptor 2
    points at /dev/null (as during the CPU memory measurement), it still writes its line."""
    script = textwrap.dedent(
        """
        import os, signal, sys, time, types
        from hetplan.runtime import worker
        worker.TERM_GRACE_S = 0.2
        fake = types.ModuleType("hetplan.runtime.comm")
        fake.waiting_on = lambda: "rank 1 (n0/1) step 4: waiting on the loss all-reduce"
        sys.modules["hetplan.runtime.comm"] = fake
        where = worker._Where(rank=1, address="n0/1", step=4, doing="training")
        worker._stop_after_grace_on_sigterm(where)
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
        """
    )
    stderr = tmp_path / "stderr.log"
    with stderr.open("w") as err:
        proc = subprocess.run([sys.executable, "-c", script], stderr=err, cwd=ROOT, timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    assert stderr.read_text() == "error: rank 1 (n0/1) step 4: waiting on the loss all-reduce: stopped by SIGTERM\n"


def test_the_stopped_line_says_what_the_rank_was_doing_when_it_waits_on_nothing() -> None:
    from hetplan.runtime import worker

    where = worker._Where(rank=0, address="n0/0", step=2, doing="training")
    assert comm.waiting_on() is None
    assert worker._stopped_line(where, signal.SIGTERM) == "rank 0 (n0/0) step 2: stopped by SIGTERM while training"


def _run_folder(tmp_path: Path, lines: dict[int, str], failures: dict) -> Path:
    for rank, line in lines.items():
        folder = tmp_path / "torchrun" / "job" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stderr.log").write_text(line + "\n" if line else "")
    (tmp_path / "failures.json").write_text(json.dumps(failures))
    return tmp_path


def test_a_survivor_blocked_on_the_dead_rank_is_named_but_not_one_stopped_in_compute(tmp_path: Path) -> None:
    addresses = ["n0/0", "n0/1", "n0/2"]
    work = _run_folder(
        tmp_path,
        {
            0: "error: rank 0 (n0/0) step 5: waiting on SA1>n0/1: stopped by SIGTERM",
            1: "",
            2: "error: rank 2 (n0/2) step 5: stopped by SIGTERM while training",
        },
        {"1": {"exitcode": -9, "signal": "SIGKILL", "pid": 1}},
    )
    message = _failure_message(work, addresses, 1)
    assert message.startswith(
        "the run stopped: rank 1 (n0/1) died (SIGKILL); rank 0 (n0/0) step 5: waiting on SA1>n0/1: stopped by SIGTERM ("
    ), message
    assert "rank 2" not in message
    # the whole job was signalled: every rank was stopped alike, and none of them is news
    signalled = _failure_message(work, addresses, 128 + signal.SIGTERM, {1: signal.SIGKILL})
    assert "rank 0" not in signalled and signalled.startswith("the run stopped: torchrun's agent got SIGTERM")


def test_a_large_jobs_survivors_stopped_while_waiting_are_named_a_few_then_counted(tmp_path: Path) -> None:
    from hetplan.runtime.launcher import NAMED_WAITING

    addresses = [f"n0/{r}" for r in range(8)]
    lines = {r: f"error: rank {r} (n0/{r}) step 5: waiting on SA{r}>n0/{r + 1}: stopped by SIGTERM" for r in range(7)}
    lines[7] = ""
    work = _run_folder(tmp_path, lines, {"7": {"exitcode": -9, "signal": "SIGKILL", "pid": 1}})
    message = _failure_message(work, addresses, 1)
    first = "the run stopped: rank 7 (n0/7) died (SIGKILL); rank 0 (n0/0) step 5: waiting on"
    assert message.startswith(first), message
    named = [r for r in range(7) if f"rank {r} (n0/{r}) step 5" in message]
    assert named == list(range(NAMED_WAITING))
    assert f"; {7 - NAMED_WAITING} more ranks were stopped while waiting (rank logs: " in message

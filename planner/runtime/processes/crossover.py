"""Two training jobs on the same devices at once: a turn per device, and launching the jobs together.

    turn = DeviceTurn(config.crossover, "n0/1")   # in a rank: hold the device while computing
    waited = turn.acquire(); ...forward...; turn.release()

    results = launch_together([config_a, config_b], steps=20, logs=["a.jsonl", "b.jsonl"], emulate=True)

Crossover scheduling: while one job waits for its communication (a pipeline transfer, a gradient
all-reduce, an emulated link's pacing), the other computes on the same device, so communication of
one job hides behind compute of the other. Neither job's maths changes: each job is its own
torchrun group (its own agent, port, run folder and run log) and trains exactly as it would alone;
the jobs share nothing but the turns.

**The turn.** One lock file per device (``<address>.lock`` in the folder the rank configs name,
``crossover.turns``), taken with ``fcntl.flock``: a rank holds its device's turn while it computes
(each forward and backward with, under emulation, the sleep that stretches it to the emulated
device's speed, which stands for compute; the optimizer step) and releases it after each compute,
so nothing else holds it: transfers, collectives, the pacing sleeps of emulated links and waiting
for peers run without it. When both jobs have compute ready they alternate compute by compute;
when one waits on communication the other computes alone. This is the co-simulator's
``first-come`` policy (:mod:`hetplan.simulate.exclusive`: the device goes to the compute that
became ready first). A first version let a job keep the device while its next compute was ready
(the co-simulator's ``crossover`` policy): a data-parallel job then held it for the whole of its
forwards and backwards while a pipeline job's ranks, which let go at every receive, waited behind
each such burst, so the pipeline job crawled until the other one had finished and then ran alone
(docs/runtime.md, "Two jobs on the same devices").

Why flock: the kernel releases it when the holder dies, however it dies (a SIGKILLed rank cannot
leave a device locked), it needs no process of its own, and a blocked ``flock`` costs no CPU.
flock is not fair (a rank that lets go and asks again at once would usually win the lock back
before the waiting rank has been scheduled), so the device's lock is entered through a second one,
``<address>.queue``, held while waiting for the device: at most one rank waits at the device, and
one that has just let go queues behind it. A turn is never held while its rank waits for another
rank, so two jobs cannot deadlock on turns: a holder always finishes its compute and lets go.
(That is why tensor-parallel stages are refused, whose collectives run inside compute, and NCCL,
whose device synchronisation inside compute would also wait for the job's collectives.)

**The start line.** With ``crossover.ranks`` every rank, once built, waits until the ranks of all
the jobs are ready too (a file each in ``ready/``), so the jobs' first steps start together.

**The trace.** Each rank records the moments it held its turn (``time.monotonic``, the same clock
in every process on a machine) and writes them to ``trace-<job>@<address>.txt`` in the turns folder
once per step: what the tests check exclusivity with and what a co-run reports as each device's
share per job.

**Launching.** :func:`launch_together` starts one :class:`~hetplan.runtime.launcher.LocalRun` per
job (each with torchrun's standalone rendezvous on a free port of its own) and watches them all;
each keeps its own fault messages and stall detection. When one job fails, the others are stopped
at once, and the error has one line per job: the failed job's own message, and for each other job
how far it got. Both jobs' run logs are written with the steps done so far, as
:func:`~hetplan.runtime.launcher.launch_local` writes one job's.

**Signals.** SIGTERM, SIGINT and SIGHUP to the launching process (``hetplan launch a.yaml b.yaml``)
are noted (:class:`~hetplan.runtime.processes.interrupt.StopSignals`, set before the first agent starts), and
the watch loop, between two polls, stops every rank of both jobs, writes both run logs so far and
raises :class:`~hetplan.runtime.processes.interrupt.InterruptedRunError` (exit code 128 + the signal) with one
line naming each job's steps and log. Without it a ``kill`` ended the command at once while both
agents, in sessions of their own, kept training.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from hetplan.contracts.rank_config import Crossover, load_rank_config
from hetplan.errors import HetplanError
from hetplan.runtime.processes.interrupt import InterruptedRunError, StopSignals

if TYPE_CHECKING:
    from hetplan.runtime.launcher import LaunchResult, LocalRun

__all__ = ["DeviceTurn", "launch_together", "read_turn_traces", "turn_file", "wait_for_co_runners"]


def turn_file(turns: str | Path, address: str) -> Path:
    """The lock file of device ``address`` (``n0/1`` -> ``n0%2F1.lock``) in the turns folder."""
    return Path(turns) / f"{quote(address, safe='')}.lock"


class DeviceTurn:
    """One rank's side of its device's turn: an exclusive ``flock`` on the device's lock file,
    entered through a second lock, the queue, so that a rank that lets go cannot take the device
    straight back from a rank of another job waiting for it (module docstring).

    :meth:`acquire` returns at once when already held, :meth:`release` when already free.
    """

    def __init__(self, crossover: Crossover, address: str) -> None:
        self.address = address
        folder = Path(crossover.turns)
        folder.mkdir(parents=True, exist_ok=True)
        # O_CLOEXEC: a process this rank might start must not inherit (and so keep) a lock
        flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
        self._device = os.open(turn_file(folder, address), flags, 0o644)
        self._queue = os.open(turn_file(folder, address).with_suffix(".queue"), flags, 0o644)
        self._trace_path = folder / f"trace-{crossover.job}@{quote(address, safe='')}.txt"
        self._held: list[tuple[float, float]] = []
        self._since: float | None = None

    @property
    def held(self) -> bool:
        return self._since is not None

    def acquire(self) -> float:
        """Take the device's turn (waiting behind a rank already waiting for it); the seconds waited
        (0 when already held)."""
        if self._since is not None:
            return 0.0
        asked = time.monotonic()
        # the queue: at most one rank waits at the device's lock; a rank that has just let go
        # queues here behind it instead of taking the device straight back
        fcntl.flock(self._queue, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._device, fcntl.LOCK_EX)
        finally:
            fcntl.flock(self._queue, fcntl.LOCK_UN)
        self._since = time.monotonic()
        return self._since - asked

    def release(self) -> None:
        """Give the device's turn back (to the rank of another job waiting for it, if any)."""
        if self._since is None:
            return
        self._held.append((self._since, time.monotonic()))
        self._since = None
        fcntl.flock(self._device, fcntl.LOCK_UN)

    def flush(self) -> None:
        """Append the intervals held since the last flush to the trace file (once a step)."""
        if not self._held:
            return
        with open(self._trace_path, "a", encoding="utf-8") as out:
            out.write("".join(f"{a:.6f} {b:.6f}\n" for a, b in self._held))
        self._held.clear()

    def close(self) -> None:
        self.release()
        self.flush()
        os.close(self._device)
        os.close(self._queue)


def wait_for_co_runners(crossover: Crossover, address: str, *, timeout_s: float) -> float:
    """The start line: say this rank is ready, then wait until the ranks of every co-running job
    are (``crossover.ranks``; no wait without it). The seconds waited.

    Each job's ranks meet at their own rendezvous; without this, one job's torchrun start-up (a
    second or two) would let it train alone for a while, and a co-run's measured rates would mix
    steps alone and steps together. Files, not a collective: the jobs share no process group.
    """
    if not crossover.ranks:
        return 0.0
    folder = Path(crossover.turns) / "ready"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{crossover.job}@{quote(address, safe='')}").touch()
    start = time.monotonic()
    while True:
        ready = sum(1 for _ in folder.iterdir())
        if ready >= crossover.ranks:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(
                f"{ready} of the co-run's {crossover.ranks} ranks were ready after {timeout_s:g} s (another job "
                "did not start)"
            )
        time.sleep(0.01)


def read_turn_traces(turns: str | Path) -> dict[str, list[tuple[str, float, float]]]:
    """Every device's held intervals ``(job, start, end)``, in start order (monotonic seconds)."""
    out: dict[str, list[tuple[str, float, float]]] = {}
    for path in sorted(Path(turns).glob("trace-*@*.txt")):
        # trace-JOB@ADDRESS: a job name holds no "@", a quoted address holds none either
        job, _, address = path.stem[len("trace-") :].partition("@")
        rows = out.setdefault(unquote(address), [])
        for line in path.read_text(encoding="utf-8").splitlines():
            a, b = line.split()
            rows.append((job, float(a), float(b)))
    for rows in out.values():
        rows.sort(key=lambda r: r[1])
    return out


def launch_together(
    configs: Sequence[str | Path],
    *,
    steps: int,
    names: Sequence[str] | None = None,
    logs: Sequence[str | Path | None] | None = None,
    emulate: bool = False,
    saves: Sequence[str | Path | None] | None = None,
    save_every: int | None = None,
    keep_last: int | None = None,
    resumes: Sequence[str | Path | None] | None = None,
    resume_step: int | None = None,
    threads: int = 1,
    progress: Callable[[int, int], None] | None = None,
    run_dirs: Sequence[str | Path | None] | None = None,
    stall_s: float | None = None,
    kill_rank_after: tuple[int, int, float] | None = None,
    kill_signal: signal.Signals = signal.SIGKILL,
) -> list[LaunchResult]:
    """Train ``steps`` steps of every rank config's job at once, here; one result per job.

    The jobs share devices through their rank configs' ``crossover`` section (the same ``turns``
    folder). ``logs``, ``saves``, ``resumes``, ``run_dirs``: one per job (each job saves into its
    own folder: one job at a time may save into one). ``progress(done, steps)`` gets the slowest
    job's count. A failure of any job stops all of them and raises one :class:`HetplanError` with
    one line per job. ``kill_rank_after=(job, rank, seconds)``: for fault tests, as
    :func:`~hetplan.runtime.launcher.launch_local`'s.
    """
    # here, not at the top: every rank imports this module (DeviceTurn) and needs no launcher
    from hetplan.runtime.launcher import POLL_S, LocalRun

    n = len(configs)
    names = list(names) if names is not None else [chr(ord("a") + i) for i in range(n)]

    def each(values: Sequence | None) -> list:
        if values is None:
            return [None] * n
        if len(values) != n:
            raise HetplanError(f"expected one value per job ({n}), got {len(values)}")
        return list(values)

    logs_, saves_, resumes_, dirs_ = each(logs), each(saves), each(resumes), each(run_dirs)
    counts = [0] * n

    def report(i: int) -> Callable[[int, int], None]:
        def seen(done: int, _total: int) -> None:
            counts[i] = done
            if progress:
                progress(min(counts), steps)

        return seen

    for path in configs:  # every file checked before any job starts
        load_rank_config(path)
    runs: list[LocalRun] = []
    # from before the first agent starts, as launch_local: no moment where a signal orphans a job
    with StopSignals() as signals:
        try:
            for i, path in enumerate(configs):
                if signals.received is not None:  # a signal while the jobs start: start no more
                    break
                runs.append(
                    LocalRun(
                        path,
                        steps=steps,
                        emulate=emulate,
                        save=saves_[i],
                        save_every=save_every,
                        keep_last=keep_last,
                        resume=resumes_[i],
                        resume_step=resume_step,
                        threads=threads,
                        progress=report(i),
                        run_dir=dirs_[i],
                        stall_s=stall_s,
                        kill_rank_after=kill_rank_after[1:] if kill_rank_after and kill_rank_after[0] == i else None,
                        kill_signal=kill_signal,
                    )
                )
            done = [False] * n
            while signals.received is None and not all(done):
                for i, run in enumerate(runs):
                    if done[i]:
                        continue
                    try:
                        done[i] = run.poll()
                    except HetplanError as exc:
                        message = _stopped_together(runs, names, done, i, exc)
                        for other in runs:
                            other.stop()
                        _collect_so_far(runs, logs_)  # each job's steps so far, as launch_local writes them
                        raise HetplanError(message) from None
                if not all(done):
                    time.sleep(POLL_S)
        finally:
            for run in runs:
                run.stop()
        if signals.received is not None:
            steps_done = _collect_so_far(runs, logs_)
            raise InterruptedRunError(
                f"stopped by {signals.name}; every rank of every job has ended; "
                + "; ".join(_interrupted_line(names[i], steps_done, logs_[i], runs, i, steps) for i in range(n)),
                signum=signals.received,
            )
    return [run.collect(log) for run, log in zip(runs, logs_, strict=True)]


def _collect_so_far(runs: list[LocalRun], logs: list[str | Path | None]) -> list[int]:
    """Write each started job's run log with the steps done so far (its rank logs kept: they are
    where to look); each job's number of steps every rank finished."""
    done = []
    for run, log in zip(runs, logs, strict=False):
        result = run.collect(log, keep=True)
        done.append(sum(1 for r in result.records if r["rank"] == 0))  # rank 0's steps, as launch_local counts
    return done


def _interrupted_line(
    name: str, steps_done: list[int], log: str | Path | None, runs: list[LocalRun], i: int, steps: int
) -> str:
    """``job a: 3 of 20 steps, run log so far: a.jsonl (rank logs: ...)``; a job not yet started says so."""
    if i >= len(runs):
        return f"job {name}: not started"
    text = f"job {name}: {steps_done[i]} of {steps} steps"
    if log:
        text += f", run log so far: {log}"
    return text + f" (rank logs: {runs[i].work})"


def _stopped_together(runs: list[LocalRun], names: list[str], done: list[bool], failed: int, exc: HetplanError) -> str:
    """One line per job: the failed job's own message; each other job's own failure if it failed
    too, else how far it got before it was stopped (it is stopped here, before its line is made)."""
    lines = {failed: f"job {names[failed]}: {exc}"}
    for j, run in enumerate(runs):
        if j == failed:
            continue
        if done[j]:
            lines[j] = f"job {names[j]}: finished its {run.steps} steps"
            continue
        try:
            finished = run.poll()
        except HetplanError as other:  # it failed as well (at the same moment, or because of the same cause)
            lines[j] = f"job {names[j]}: {other}"
            continue
        if finished:
            lines[j] = f"job {names[j]}: finished its {run.steps} steps"
            continue
        run.stop()
        lines[j] = (
            f"job {names[j]}: stopped after {run.steps_done} of {run.steps} steps because job {names[failed]} "
            f"failed (rank logs: {run.work})"
        )
    return "\n".join(lines[j] for j in sorted(lines))

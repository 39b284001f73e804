"""Run every rank of a plan on this machine through torchrun's standalone mode, watch it, merge its logs.

    result = launch_local("launch/rank-config.yaml", steps=20, log="run.jsonl")

The job is one torchrun agent (``torch.distributed.run --standalone --nproc-per-node N
--max-restarts 0 --redirects 3 --log-dir RUN/torchrun``) running ``python -m
hetplan.runtime.worker CONFIG --node-name NODES``: each worker finds its device by ``LOCAL_RANK`` among
the rank config's devices, in rank-config order (several nodes are listed comma-separated, so a
plan of several nodes runs under the one agent too). With ``HETPLAN_RANK_START=forkserver`` (what the
test suite sets) one fork server imports torch and the runtime once and forks the ranks from it
(torchrun's own ``--start-method forkserver --run-path``, :mod:`hetplan.runtime.processes.forked_rank`): about
2.5 s of CPU less per rank, and the same messages, signals and exit codes. What hetplan adds around torchrun:

* **one line when a rank dies.** torchrun ends the other workers itself once one fails (it never
  restarts them: ``--max-restarts 0``); each worker gets a few seconds after SIGTERM to report what
  it was waiting on (``hetplan.runtime.worker``). The agent runs through this module
  (``python -m hetplan.runtime.launcher FAILURES -- TORCHRUN-ARGS``, which is ``torch.distributed.run``'s
  own parser and ``run``), so the failed ranks and their exit codes or signals come back as JSON
  rather than torchrun's multi-line report; the launcher joins them with each rank's last
  ``error:`` line (torchrun's ``--redirects 3`` puts each rank's stdout and stderr in
  ``RUN/torchrun/.../attempt_0/R/``) into one error naming the ranks, steps and actions.
* **stall detection.** No finished step for the rank timeout plus 30 s stops everything with one
  line that says how far each rank got.
* **no orphans.** torchrun starts every worker in a session of its own, so killing the agent's
  process group would leave them running: each worker writes its pid (``RUN/ranks/rank-R.json``),
  and the launcher kills every worker's process group, then the agent's (SIGTERM first: the agent
  then ends any worker that had not written its pid yet).
* **one run log.** Each rank appends to ``RUN/rank-R.jsonl``; they are merged, sorted by step and
  rank, into ``log`` (also when the run fails or is stopped: the steps so far), where under wsp and
  sdpipe each step's ``loss`` becomes the global batch's, from the pipelines' own
  (:func:`hetplan.contracts.runlog.fill_global_loss`); progress is rank 0's
  count of finished steps, and ``on_step`` gets each step once every rank has logged it
  (:mod:`hetplan.runtime.processes.watch`: loss, step time, samples/s).
* **signals.** SIGTERM, SIGINT or SIGHUP to the launching process stops every rank (as above),
  writes the run log so far and raises :class:`~hetplan.runtime.processes.interrupt.InterruptedRunError` (exit code
  128 + the signal); the same signals sent to the agent itself end it and its workers (torchrun
  forwards them; each worker ends within its grace period), and the launcher says so.
* **non-finite losses.** A step whose loss (or, without loss scaling, gradient) is not finite is
  not applied on any rank (they all see the same all-reduced loss); the ranks then stop together
  after logging it, and the launcher raises one line naming the step, unless ``skip_nonfinite``:
  then they keep going and the log counts the steps skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hetplan.contracts.rank_config import RankConfig, load_rank_config
from hetplan.contracts.runlog import fill_global_loss, is_central
from hetplan.errors import HetplanError
from hetplan.runtime.processes.agent_start import ForkedAgent, start_agent
from hetplan.runtime.processes.interrupt import STOP_SIGNALS, InterruptedRunError, StopSignals
from hetplan.runtime.processes.watch import StepLine, StepWatcher
from hetplan.runtime.worker import TERM_GRACE_S  # what a worker has, after SIGTERM, to say where it was

__all__ = [
    "RANK_START_ENV",
    "LaunchResult",
    "LocalRun",
    "launch_local",
    "rank_module_names",
    "rank_start_method",
    "refuse_nonfinite",
]

#: Added to the rank timeout before a job with no finished step is called stalled.
STALL_MARGIN_S = 30.0

#: Seconds between two looks at a running job (its agent, rank 0's log).
POLL_S = 0.1

#: ``forkserver``: the ranks are forked from a server that has imported what they need
#: (:func:`rank_start_method`).
RANK_START_ENV = "HETPLAN_RANK_START"

#: What a rank imports before its first step (``hetplan.runtime.worker``'s ``run``), preloaded by the
#: fork server.
_RANK_MODULES = (
    "torch",
    "torch.distributed",
    "hetplan.contracts.rank_config",
    "hetplan.runtime.worker",
    "hetplan.runtime.executor",
    "hetplan.runtime.checkpoint",
    "hetplan.runtime.sync.central",
    "hetplan.runtime.device.rank_device",
    "hetplan.runtime.device.transport",
    "hetplan.runtime.memtrack",
    "hetplan.runtime.validate",
    "hetplan.schedule.compile",
    "hetplan.runtime.processes.warm",
)


@dataclass
class LaunchResult:
    records: list[dict]
    wall_s: float
    log: Path | None
    central: list[dict] = field(default_factory=list)  # the central process's line (wsp), apart from the steps


def launch_local(
    config_path: str | Path,
    *,
    steps: int,
    log: str | Path | None = None,
    emulate: bool = False,
    save: str | Path | None = None,
    save_every: int | None = None,
    keep_last: int | None = None,
    resume: str | Path | None = None,
    resume_step: int | None = None,
    threads: int = 1,
    progress: Callable[[int, int], None] | None = None,
    blocking_allreduce: bool = False,
    run_dir: str | Path | None = None,
    stall_s: float | None = None,
    kill_rank_after: tuple[int, float] | None = None,
    kill_signal: signal.Signals = signal.SIGKILL,
    crash_in_save: tuple[int, int] | None = None,
    on_step: Callable[[StepLine], None] | None = None,
    skip_nonfinite: bool = False,
) -> LaunchResult:
    """Train ``steps`` steps with every rank here; raise one-line :class:`HetplanError` on failure.

    ``save`` saves the final state there (and after every ``save_every`` steps; ``keep_last`` keeps
    only the newest checkpoints); ``resume`` continues from a checkpoint folder's latest (or
    ``resume_step``'s) checkpoint, under this plan whatever plan saved it. ``run_dir`` keeps the
    per-rank logs (default: a temporary folder, removed after a run that succeeds). ``stall_s``
    overrides the rank timeout + 30 s after which a job with no finished step is stopped (once a
    step has finished: until then the ranks are starting, bounded by their own timeout).
    ``on_step(line)`` is called for each step once every rank has logged it. A non-finite loss
    stops the run with one line naming the step, unless ``skip_nonfinite`` (the step's update is
    skipped on every rank, and the run goes on). A failed or stopped run still writes ``log`` with
    the steps done so far; SIGTERM, SIGINT or SIGHUP raise :class:`InterruptedRunError` once every rank has
    ended.

    For fault tests: ``kill_rank_after=(rank, seconds)`` sends ``kill_signal`` to that rank's
    process after that long, and not before a step has finished (so that it lands in training,
    however long the start takes); ``crash_in_save=(rank, step)`` kills that rank in the middle of the
    checkpoint of that step (its files written, the checkpoint not yet published).
    """
    with StopSignals() as signals:  # from before the agent starts: no moment where a signal orphans it
        run = LocalRun(
            config_path,
            steps=steps,
            emulate=emulate,
            save=save,
            save_every=save_every,
            keep_last=keep_last,
            resume=resume,
            resume_step=resume_step,
            threads=threads,
            progress=progress,
            blocking_allreduce=blocking_allreduce,
            run_dir=run_dir,
            stall_s=stall_s,
            kill_rank_after=kill_rank_after,
            kill_signal=kill_signal,
            crash_in_save=crash_in_save,
            on_step=on_step,
            skip_nonfinite=skip_nonfinite,
        )
        try:
            while signals.received is None and not run.poll():
                time.sleep(POLL_S)
        except HetplanError:
            run.stop()
            run.collect(log, keep=True)  # the steps so far; the rank logs stay for the message's pointer
            raise
        finally:
            run.stop()
        if signals.received is not None:
            done = run.collect(log, keep=True)
            raise InterruptedRunError(
                f"stopped by {signals.name} after {_steps_done(done.records)} of {steps} steps; every rank has "
                "ended" + (f"; run log so far: {log}" if log else "") + f" (rank logs: {run.work})",
                signum=signals.received,
            )
        result = run.collect(log)
    if not skip_nonfinite:
        refuse_nonfinite(result.records, log)
    return result


class LocalRun:
    """One job under one torchrun agent: started by the constructor, watched by :meth:`poll`, ended
    by :meth:`stop`, its logs merged by :meth:`collect`.

    :func:`launch_local` drives one; :func:`hetplan.runtime.processes.crossover.launch_together` drives two
    at once (each its own agent, port and folder), which is why the watching is a method that returns
    rather than a loop: a co-run polls both and stops the other job when one fails. The arguments
    are :func:`launch_local`'s.
    """

    def __init__(
        self,
        config_path: str | Path,
        *,
        steps: int,
        emulate: bool = False,
        save: str | Path | None = None,
        save_every: int | None = None,
        keep_last: int | None = None,
        resume: str | Path | None = None,
        resume_step: int | None = None,
        threads: int = 1,
        progress: Callable[[int, int], None] | None = None,
        blocking_allreduce: bool = False,
        run_dir: str | Path | None = None,
        stall_s: float | None = None,
        kill_rank_after: tuple[int, float] | None = None,
        kill_signal: signal.Signals = signal.SIGKILL,
        crash_in_save: tuple[int, int] | None = None,
        on_step: Callable[[StepLine], None] | None = None,
        skip_nonfinite: bool = False,
    ) -> None:
        config = load_rank_config(config_path)
        if save_every is not None and (save_every < 1 or not save):
            raise HetplanError("needs a checkpoint folder (--save) and a number of steps >= 1", field="--save-every")
        if keep_last is not None and (keep_last < 1 or not save):
            raise HetplanError("needs a checkpoint folder (--save) and a count >= 1", field="--keep-last")
        if resume_step is not None and not resume:
            raise HetplanError("needs a checkpoint folder (--resume)", field="--resume-step")
        nodes = list(config.nodes)
        if any("," in n for n in nodes):
            raise HetplanError("a node name with a comma cannot be launched here", file=config.file, field="nodes")
        addresses = [a for n in nodes for a in config.nodes[n]]  # rank R (= LOCAL_RANK R) runs addresses[R]
        self.world = len(addresses)  # the ranks that train and log steps
        if config.central_node is not None:  # wsp, sdpipe: one more process, the central role, last
            addresses.append("central")
        self.addresses = addresses
        self.steps = steps
        self.progress = progress
        self.keep_run_dir = run_dir is not None
        work = self.work = Path(run_dir).resolve() if run_dir else Path(tempfile.mkdtemp(prefix="hetplan-run-"))
        work.mkdir(parents=True, exist_ok=True)
        self.status = work / "ranks"
        worker = _worker_args(config_path, nodes, steps=steps, work=work, threads=threads)
        worker += ["--emulate"] if emulate else []
        worker += ["--blocking-allreduce"] if blocking_allreduce else []
        worker += ["--save", str(Path(save).resolve())] if save else []
        worker += ["--save-every", str(save_every)] if save_every else []
        worker += ["--keep-last", str(keep_last)] if keep_last else []
        worker += ["--resume", str(Path(resume).resolve())] if resume else []
        worker += ["--resume-step", str(resume_step)] if resume_step is not None else []
        worker += ["--crash-in-save", f"{crash_in_save[0]}:{crash_in_save[1]}"] if crash_in_save else []
        worker += ["--skip-nonfinite"] if skip_nonfinite else []
        self.on_step = on_step
        self.watcher = StepWatcher(work, world=self.world, global_batch=config.global_batch, steps=steps)
        # forked ranks run under torchrun's multiprocessing context, which records only the first
        # failure it polls: a rank that kills itself on purpose (crash_in_save) may then go unnamed, so
        # those runs start ranks fresh, as torchrun's subprocess context names every failed rank; a rank
        # the launcher kills (kill_rank_after) it names itself
        hooks = crash_in_save is not None
        preload = rank_start_method() == "forkserver" and not _on_cuda(config) and not hooks
        torchrun = _torchrun_args(len(addresses), work, worker, preload=preload)
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = str(threads)  # set: torchrun then neither overrides it nor warns
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # GPUs in PCI order, as the cluster file numbers them
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        failures = work / "failures.json"
        command = [sys.executable, "-m", "hetplan.runtime.launcher", str(failures), "--", *torchrun]
        self.start = time.time()
        # forked ranks, forked agent: the fork server that saves each rank its imports saves the agent its own
        self.agent = start_agent(command, env=env, log=work / "agent.log", forked=preload)
        (work / "agent.pid").write_text(f"{self.agent.pid}\n", encoding="utf-8")  # who to signal, for a person too
        self.timeout_s = config.timeout_s
        self.stall_limit = stall_s if stall_s is not None else config.timeout_s + STALL_MARGIN_S
        self.last_progress, self.count = time.time(), -1
        self.kill_rank_after, self.kill_signal = kill_rank_after, kill_signal
        self.killed: dict[int, signal.Signals] = {}  # ranks this launcher killed (the kill hook)

    def poll(self) -> bool:
        """True once the job has finished; raises one-line :class:`HetplanError` if it failed or
        stalled (then call :meth:`stop`, which ends whatever is left of it)."""
        work, status = self.work, self.status
        code = self.agent.poll()
        count = _count_lines(work / "rank-0.jsonl")
        if count != self.count:
            self.count, self.last_progress = count, time.time()
            if self.progress:
                self.progress(count, self.steps)
        if self.on_step:
            for line in self.watcher.poll():
                self.on_step(line)
        if code == 0:
            return True
        if code is not None:
            signum = _agent_signal(code)
            if signum is not None:
                raise InterruptedRunError(_failure_message(work, self.addresses, code, self.killed), signum=signum)
            raise HetplanError(_failure_message(work, self.addresses, code, self.killed))
        kill = self.kill_rank_after
        if kill and not self.killed and count > 0 and time.time() - self.start > kill[1]:
            pid = _worker_pids(status).get(kill[0])
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, self.kill_signal)
                self.killed = {kill[0]: self.kill_signal}
        # before the first step the ranks start (imports, rendezvous, model): their own timeout bounds that
        limit = self.stall_limit if count > 0 else max(self.stall_limit, self.timeout_s + STALL_MARGIN_S)
        if time.time() - self.last_progress > limit:
            _stop(self.agent, status)
            raise HetplanError(
                f"no step finished for {limit:.0f} s; stopped every rank ({_how_far(work, self.addresses)})"
                + _details(work, self.addresses)
                + f" (rank logs: {work})"
            )
        return False

    @property
    def steps_done(self) -> int:
        """Rank 0's number of finished steps, as last polled."""
        return max(self.count, 0)

    def stop(self) -> None:
        """End whatever is left of the job (nothing once it has ended by itself)."""
        _stop(self.agent, self.status)

    def collect(self, log: str | Path | None = None, *, keep: bool = False) -> LaunchResult:
        """Every rank's records, sorted by step and rank, written to ``log`` if given; the run folder
        is removed unless it was asked for or ``keep`` (a failed run: its rank logs are where to look)."""
        records = []
        for rank in range(len(self.addresses)):  # the central process's line too (wsp)
            path = self.work / f"rank-{rank}.jsonl"
            if path.is_file():
                records += [json.loads(ln) for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        central = [r for r in records if is_central(r)]  # wsp's parameter server: no steps, its memory
        records = [r for r in records if not is_central(r)]
        records.sort(key=lambda r: (r["step"], r["rank"]))
        # wsp, sdpipe: each rank logged its pipeline's loss; every line gets the global batch's
        records = fill_global_loss(records, global_batch=self.watcher.global_batch)
        target = Path(log) if log else None
        if target:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(json.dumps(r) + "\n" for r in records + central), encoding="utf-8")
        if not self.keep_run_dir and not keep:
            shutil.rmtree(self.work, ignore_errors=True)
        return LaunchResult(records=records, wall_s=time.time() - self.start, log=target, central=central)


# -- the command --------------------------------------------------------------------------------------


def _worker_args(config_path: str | Path, nodes: list[str], *, steps: int, work: Path, threads: int) -> list[str]:
    """The worker's arguments every launch passes (torchrun's ``-m`` runs the module). The backend is
    the rank config's (``hetplan launch`` writes gloo; a config that says nccl runs NCCL, one rank a GPU).

    ``--node-name`` and ``--run-log`` rather than ``--node`` and ``--log``: torchrun's parser reads
    every argument and refuses a prefix of its own options (``--node-rank``, ``--log-dir``).
    """
    return [
        "-m",
        "hetplan.runtime.worker",
        str(Path(config_path).resolve()),
        "--node-name",
        ",".join(nodes),
        "--steps",
        str(steps),
        "--run-log",
        str(work / "rank-{rank}.jsonl"),
        "--threads",
        str(threads),
        "--status-dir",
        str(work / "ranks"),
    ]


def rank_start_method() -> str:
    """How torchrun's agent starts the ranks: ``spawn`` (the default, torchrun's own, and what runs
    across machines: each rank a fresh Python) or ``forkserver`` (``HETPLAN_RANK_START=forkserver``).

    A fresh rank imports torch again (about 2.5 s of CPU); under ``forkserver`` the agent starts one
    server that imports what a rank needs once (:func:`rank_module_names`) and forks each rank from
    it. Not from the agent itself: by then the agent runs threads (its rendezvous store), and a fork
    of a process with threads can inherit a lock another thread held. One rank of eight, forked from
    the agent in CI, never reached the rendezvous (the others timed out waiting for it); the fork
    server is a single thread. Everything else is the same torchrun: rendezvous, redirects, failure
    report. The test suite uses the fork server (tests/conftest.py); the tests that pin the
    launcher's behaviour run both ways.
    """
    value = os.environ.get(RANK_START_ENV, "spawn").strip().lower()
    if value not in ("forkserver", "spawn"):
        raise HetplanError(f"is {value!r}; use forkserver or spawn", field=RANK_START_ENV)
    return value


def _on_cuda(config: RankConfig) -> bool:
    """Whether the ranks compute on a GPU (NCCL, or ``compute_device: cuda``): such ranks are never
    forked, whatever ``HETPLAN_RANK_START`` says. On an H100 ranks forked from the agent failed with
    "Cannot re-initialize CUDA in forked subprocess" (the agent had initialised CUDA while importing
    what they need; benchmarks/results/gpu_check-H100-SXM.part5.md): CUDA does not survive a fork."""
    if config.compute_device is not None:
        return config.compute_device == "cuda"
    return config.backend == "nccl"


def rank_module_names(config_path: str | Path | None = None) -> list[str]:
    """What every rank imports, for the fork server to import once; with the rank config, also a
    Hugging Face model's ``transformers`` modules (about 6 s of CPU a rank)."""
    names = list(_RANK_MODULES)
    if config_path is None:
        return names
    try:  # only a speed-up: a config that does not load is the ranks' to report, in their one line
        model = load_rank_config(config_path).model
    except (HetplanError, OSError):
        return names
    source = str(model.get("hf", "")).lower() if isinstance(model, dict) else ""
    if source:
        names.append("hetplan.models.hf")
        names += [f"transformers.models.{kind}.modeling_{kind}" for kind in ("gpt2", "llama", "bert") if kind in source]
    return names


def _start_fork_server(config_path: str | None) -> None:
    """Start the fork server now, importing what the ranks need while the agent sets up its
    rendezvous; torchrun's ``forkserver`` start method then forks every rank from it."""
    import multiprocessing
    import multiprocessing.forkserver

    from hetplan.runtime.processes.fork_server import short_socket_folder, start_fork_server

    preload = rank_module_names(config_path)
    if start_fork_server(preload):  # a fork of this agent, torch imported already
        return
    short_socket_folder()
    multiprocessing.set_forkserver_preload(preload)
    multiprocessing.forkserver.ensure_running()


def _torchrun_args(world: int, work: Path, worker: list[str], *, preload: bool = False) -> list[str]:
    """torchrun's arguments: one standalone node, no restarts, each rank's output in a file.

    ``preload``: each rank is forked from a fork server and runs :mod:`hetplan.runtime.processes.forked_rank`
    (torchrun's ``--start-method forkserver --run-path``) instead of ``worker``'s ``-m
    hetplan.runtime.worker``.
    """
    if preload and worker[:2] == ["-m", "hetplan.runtime.worker"]:
        script = str(Path(__file__).parent / "processes" / "forked_rank.py")
        worker = ["--start-method", "forkserver", "--run-path", script, *worker[2:]]
    return [
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        str(world),
        "--max-restarts",
        "0",
        "--redirects",
        "3",
        "--log-dir",
        str(work / "torchrun"),
        *worker,
    ]


# -- the processes -----------------------------------------------------------------------------------


def _worker_pids(status: Path) -> dict[int, int]:
    """rank -> pid of every worker that has said who it is."""
    pids: dict[int, int] = {}
    for path in status.glob("rank-*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            record = json.loads(path.read_text(encoding="utf-8"))
            pids[int(record["rank"])] = int(record["pid"])
    return pids


def _killpg(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _stop(agent: subprocess.Popen | ForkedAgent, status: Path) -> None:
    """End the job: every worker's process group, then the agent's. Nothing once the agent has
    ended by itself: it has ended and reaped its workers (and their pids may be reused)."""
    if agent.poll() is not None:
        return
    workers = list(_worker_pids(status).values())
    for pid in workers:  # the agent is alive, so these are its (or its fork server's) unreaped children
        _killpg(pid, signal.SIGKILL)
    _killpg(agent.pid, signal.SIGTERM)  # it ends any worker that had not written its pid yet
    try:
        agent.wait(timeout=TERM_GRACE_S + 2.0)
    except subprocess.TimeoutExpired:
        _killpg(agent.pid, signal.SIGKILL)
        agent.wait()
    _wait_ended(workers, within=5.0)


def _wait_ended(pids: list[int], *, within: float) -> None:
    """Wait (at most ``within`` s) until none of ``pids`` runs: a signal is delivered when its target
    next runs, so a worker sent SIGKILL may still be running for a moment on a busy machine, and
    "every rank has ended" should be true when it is said. Where /proc is absent, nothing to wait on."""
    end = time.time() + within
    while time.time() < end and any(_running(pid) for pid in pids):
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has: only its exit status is left)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# -- what to say ---------------------------------------------------------------------------------------


def _count_lines(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def _rank_stderr(work: Path, rank: int) -> Path | None:
    """torchrun's file for the stderr of local rank ``rank`` (the global rank: one agent)."""
    found = sorted((work / "torchrun").glob(f"*/attempt_*/{rank}/stderr.log"))
    return found[-1] if found else None


def _lines(path: Path | None) -> list[str]:
    if path is None:
        return []
    try:
        return [ln.strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
    except OSError:
        return []


def _last_error(path: Path | None) -> str:
    """The rank's last ``error:`` line (what a worker prints before it exits with code 3)."""
    errors = [ln for ln in _lines(path) if ln.startswith("error: ")]
    return errors[-1][len("error: ") :] if errors else ""


def _stopped(line: str) -> bool:
    """A rank's line that says only that it was stopped (another one failed, or a signal came)."""
    return any(f": stopped by {sig.name}" in line for sig in STOP_SIGNALS)


#: Survivors stopped while waiting that a failed run's line names; the rest are counted.
NAMED_WAITING = 3


def _worth_naming(line: str, *, signalled: bool) -> bool:
    """Whether a rank's last line belongs in a failed run's message: its own failure, or, where
    another rank's failure stopped it (not a signal to the whole job, which stops every rank alike),
    the transfer or collective it was still blocked in (the dead peer's, as often as not)."""
    if not line:
        return False
    return not _stopped(line) or (not signalled and ": waiting on " in line)


def _agent_signal(code: int) -> int | None:
    """The stop signal that ended the agent (its exit code: -N, or 128 + N from :func:`_agent`)."""
    signum = -code if code < 0 else code - 128 if code > 128 else None
    return signum if signum in {int(s) for s in STOP_SIGNALS} else None


def _steps_done(records: list[dict]) -> int:
    """Steps that rank 0 finished."""
    return sum(1 for r in records if r["rank"] == 0)


def refuse_nonfinite(records: list[dict], log: str | Path | None) -> None:
    """One line for a run whose ranks stopped at a non-finite loss (they log the step, then end)."""
    bad = next((r for r in records if r.get("nonfinite")), None)
    if bad is None:
        return
    what = "gradient norm" if bad["nonfinite"] == "gradient" else f"loss ({bad['nonfinite']})"
    raise HetplanError(
        f"step {bad['step']}: the {what} is not finite; stopped every rank there, without applying that step "
        "(--skip-nonfinite skips such steps and goes on)" + (f"; run log: {log}" if log else "")
    )


def _as_rank_line(rank: int, addresses: list[str], text: str) -> str:
    return text if text.startswith("rank ") else f"rank {rank} ({addresses[rank]}): {text}"


def _failure_message(
    work: Path, addresses: list[str], agent_code: int, killed: dict[int, signal.Signals] | None = None
) -> str:
    """One line: the ranks that failed (torchrun's report, and ``killed``: those the launcher itself
    killed, which a forked run's report may leave out: it names only the first failure it saw),
    each rank's last error line, or the agent's."""
    failed: dict[int, dict] = {}
    with contextlib.suppress(OSError, ValueError):
        failed = {int(r): f for r, f in json.loads((work / "failures.json").read_text(encoding="utf-8")).items()}
    for rank, sig in (killed or {}).items():
        failed.setdefault(rank, {"exitcode": -int(sig), "signal": sig.name})
    errors = {rank: _last_error(_rank_stderr(work, rank)) for rank in range(len(addresses))}
    parts = []
    signum = _agent_signal(agent_code)
    signalled = signum is not None
    if signum is not None:
        parts.append(f"torchrun's agent got {signal.Signals(signum).name} and stopped every rank")
    # survivors stopped while still waiting: the first few by rank, then how many more (in a large
    # job most of them wait on one another, and the line should stay readable)
    waiting = sorted(r for r, t in errors.items() if _stopped(t) and _worth_naming(t, signalled=signalled))
    named_waiting = set(waiting[:NAMED_WAITING])
    # the ranks torchrun saw fail first, those killed by a signal before those that exited
    for rank in sorted(failed, key=lambda r: (failed[r].get("exitcode", 0) >= 0, r)):
        code = failed[rank].get("exitcode")
        text = errors.get(rank, "")
        if rank in waiting and rank not in named_waiting:
            continue
        if _worth_naming(text, signalled=signalled):
            parts.append(_as_rank_line(rank, addresses, text))
        elif isinstance(code, int) and code < 0:
            parts.append(f"rank {rank} ({addresses[rank]}) died ({failed[rank].get('signal') or f'signal {-code}'})")
        else:  # no error line: a crash before the worker could report (an import error, say)
            last = _lines(_rank_stderr(work, rank))
            parts.append(f"rank {rank} ({addresses[rank]}) exited with code {code}" + (f": {last[-1]}" if last else ""))
    parts += [
        _as_rank_line(r, addresses, t)
        for r, t in errors.items()
        if r not in failed and _worth_naming(t, signalled=signalled) and (r not in waiting or r in named_waiting)
    ]
    if len(waiting) > NAMED_WAITING:
        parts.append(f"{len(waiting) - NAMED_WAITING} more ranks were stopped while waiting")
    if not parts:  # the agent itself failed (bad arguments, a rendezvous that never completed, ...)
        agent_lines = _lines(work / "agent.log")
        agent_line = agent_lines[-1] if agent_lines else f"exit code {agent_code}"
        parts.append(f"torchrun's agent failed: {agent_line}")
    line = "; ".join(dict.fromkeys(" ".join(p.split()) for p in parts))  # one line: gloo's texts hold newlines
    return "the run stopped: " + line + f" (rank logs: {work})"


def _how_far(work: Path, addresses: list[str]) -> str:
    """Each rank's number of finished steps: the ranks behind are where to look."""
    counts = [_count_lines(work / f"rank-{r}.jsonl") for r in range(len(addresses))]
    return "finished steps per rank: " + ", ".join(f"{a} {n}" for a, n in zip(addresses, counts, strict=True))


def _details(work: Path, addresses: list[str]) -> str:
    lines = [
        _as_rank_line(r, addresses, t)
        for r in range(len(addresses))
        if (t := _last_error(_rank_stderr(work, r))) and not _stopped(t)
    ]
    return ("; " + "; ".join(dict.fromkeys(lines))) if lines else ""


# -- the agent: torchrun, with the failures it saw written as JSON ------------------------------------


def _agent(argv: list[str]) -> int:
    """``python -m hetplan.runtime.launcher FAILURES -- TORCHRUN-ARGS``: torchrun's parser and ``run``.

    On a worker failure torchrun raises ``ChildFailedError`` with every failed rank's exit code;
    written as JSON it spares the launcher parsing torchrun's report (which goes to the agent log).
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    failures, rest = Path(argv[0]), argv[2:] if argv[1:2] == ["--"] else argv[1:]
    args = parse_args(rest)
    if args.start_method == "forkserver":  # one server imports what the ranks need, once
        _start_fork_server(args.training_script_args[0] if args.training_script_args else None)
    try:
        run(args)
    except ChildFailedError as exc:
        report = {
            str(rank): {
                "exitcode": f.exitcode,
                "signal": f.signal_name() if f.exitcode < 0 else None,
                "pid": f.pid,
            }
            for rank, f in exc.failures.items()
        }
        tmp = failures.with_name(failures.name + ".tmp")
        tmp.write_text(json.dumps(report), encoding="utf-8")
        os.replace(tmp, failures)
        print(f"torchrun: {exc.get_first_failure()[1]}", file=sys.stderr, flush=True)
        return 1
    except SignalException as exc:  # torchrun has sent the signal on to its workers and ended them
        print(f"torchrun: stopped by {signal.Signals(exc.sigval).name}", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(_agent(sys.argv[1:]))

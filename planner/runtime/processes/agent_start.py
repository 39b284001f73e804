"""torchrun's agent started as a fresh Python, or forked from a server that has imported it once.

    agent = start_agent(command, env=env, log=work / "agent.log", forked=True)
    agent.poll(); agent.wait(timeout=5.0); os.killpg(agent.pid, signal.SIGTERM)

The agent (``python -m hetplan.runtime.launcher ...``) imports ``torch.distributed.run``, about 3 s
of CPU a launch on a laptop-class core. A process that launches many runs (the test suite, a sweep
driven from Python) pays that once with ``forked``: the agent is forked from this process's
``multiprocessing`` fork server, which has imported the agent's modules, and runs the same
``_agent`` entry with the same arguments, environment (replaced whole: the server's is the one it
started with) and log, in a session of its own as :class:`subprocess.Popen`'s
``start_new_session`` gives a fresh one. :class:`ForkedAgent` is the part of ``Popen`` the launcher
uses (``pid``, ``poll``, ``wait``), the exit code the same: the agent's own, or minus the signal
that killed it. The agent is then the fork server's child, not this process's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path

__all__ = ["AGENT_MODULES", "ForkedAgent", "start_agent"]

#: What a forked agent imports before it runs, imported once by the server it is forked from (the
#: warm-up too: the agent's own fork server, and so every rank, inherits it).
AGENT_MODULES = ("torch", "torch.distributed.run", "hetplan.runtime.launcher", "hetplan.runtime.processes.warm")


class ForkedAgent:
    """An agent forked from the fork server, seen as the launcher sees a ``subprocess.Popen``.

    Whether it is still running is asked of the kernel (a pidfd), not of the fork server that
    reports its exit code: that server shares the launch's process group, so a closed terminal's
    SIGHUP ends it while the agent, in a session of its own, runs on; ``multiprocessing`` would then
    report exit code 255 for an agent that is alive, and the launcher would leave it and its ranks
    running. Where the server has gone, an ended agent's code is unknown: 255."""

    def __init__(self, process: multiprocessing.process.BaseProcess, args: list[str]) -> None:
        self._process = process
        self.args = args
        self.pid: int = process.pid  # type: ignore[assignment] (started: it has one)
        self._pidfd: int | None = None
        with contextlib.suppress(OSError):  # gone already (then the server has its code), or no pidfds
            self._pidfd = os.pidfd_open(self.pid)

    def _running(self, timeout: float | None) -> bool:
        """Whether the agent still runs after waiting up to ``timeout`` s (None: no limit) for it to end."""
        if self._pidfd is None:
            self._process.join(timeout)
            return self._process.exitcode is None
        watch = select.poll()  # poll, not select: a pidfd may be numbered past select's 1024
        watch.register(self._pidfd, select.POLLIN)
        return not watch.poll(None if timeout is None else max(0.0, timeout) * 1000.0)

    def _code(self) -> int:
        """The ended agent's exit code, from the fork server (255 where it has gone before telling)."""
        self._process.join(5.0)  # the server reaps the agent and then writes its code
        code = self._process.exitcode
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        return 255 if code is None else code

    def poll(self) -> int | None:
        """The exit code once the agent has ended, else None."""
        if self._pidfd is None and self._process.exitcode is not None:
            return self._process.exitcode
        return None if self._running(0.0) else self._code()

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, waiting at most ``timeout`` s (then :class:`subprocess.TimeoutExpired`)."""
        if self._pidfd is None and self._process.exitcode is not None:
            return self._process.exitcode
        if self._running(timeout):  # None: no limit
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self._code()


def _context() -> multiprocessing.context.BaseContext:
    """The fork server context, its server told to import the agent's modules (where it has not
    started yet: a server already running keeps what it has, and the agent imports the rest)."""
    from hetplan.runtime.processes.fork_server import short_socket_folder

    short_socket_folder()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(AGENT_MODULES))
    return context


def _run_forked(argv: list[str], env: dict[str, str], log: str) -> None:
    """The forked agent: a session of its own, stdin from /dev/null, stdout and stderr to ``log``,
    ``env`` as its whole environment, then the agent's entry (its exit code is the process's; a
    SIGINT before torchrun handles signals ends it by that signal, as it ends a fresh Python)."""
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    os.environ.clear()
    os.environ.update(env)
    from hetplan.runtime.launcher import _agent

    try:
        code = _agent(argv)
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        raise
    sys.exit(code)


def start_agent(command: list[str], *, env: dict[str, str], log: Path, forked: bool) -> subprocess.Popen | ForkedAgent:
    """Start ``command`` (``python -m hetplan.runtime.launcher ARGS``) as a fresh process, or with
    ``forked`` its ``ARGS`` in a fork of the fork server; its output (stdout and stderr) to ``log``.
    A daemonic process (a ``multiprocessing.Pool`` worker) may not have children of its own: there
    the agent is a fresh process whatever ``forked`` says."""
    if not forked or multiprocessing.current_process().daemon:
        with open(log, "w", encoding="utf-8") as out:
            return subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
    argv = command[command.index("hetplan.runtime.launcher") + 1 :]
    log.write_text("", encoding="utf-8")
    process = _context().Process(target=_run_forked, args=(argv, env, str(log)), name="hetplan-agent")
    with _main_not_inherited():
        process.start()
    return ForkedAgent(process, command)


@contextlib.contextmanager
def _main_not_inherited() -> Iterator[None]:
    """No ``__main__`` for the child to import: ``multiprocessing`` would otherwise run the calling
    script again in the agent as ``__mp_main__`` (its top level, guarded or not: a sweep script
    without ``if __name__ == "__main__"`` would start launches from its agent). The agent needs
    nothing from it, so the child is told of a main module with neither a spec nor a file."""
    with _MAIN_SWAP:  # two launches from two threads must not restore each other's stand-in
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main


_MAIN_SWAP = threading.Lock()

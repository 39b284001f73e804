"""SIGTERM, SIGINT and SIGHUP to the launching process: noted, so that the launch loop stops the job.

    with StopSignals() as signals:
        while not run.poll():
            if signals.received is not None:
                ...  # stop every rank, write the run log so far, exit non-zero
            time.sleep(0.1)

Why not the default: SIGTERM and SIGHUP would end ``hetplan launch`` at once while torchrun's agent
and its workers, each in a session of their own (:mod:`hetplan.runtime.launcher`), kept training,
and the run log (merged at the end) would never be written; SIGINT's ``KeyboardInterrupt`` could
land anywhere, in the middle of the stop itself. Here a handler only records the signal; the loop
that polls the job acts on it between two polls (within a tenth of a second), and a second signal
while it stops the job is recorded, not acted on twice.

Handlers can only be set from the main thread: elsewhere (a co-run polled from a thread, a test
runner's worker thread) this does nothing, and the caller's own handling applies. A signal the
process was told to ignore stays ignored (``nohup`` ignores SIGHUP; a shell's background job, SIGINT).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from hetplan.errors import HetplanError

__all__ = ["STOP_SIGNALS", "InterruptedRunError", "StopSignals"]

#: The signals that stop a launch: a ``kill``, a Ctrl-C, a closed terminal.
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP") if hasattr(signal, name)
)


class InterruptedRunError(HetplanError):
    """The run was stopped by a signal: one line, and the shell's exit code for it (128 + signal)."""

    def __init__(self, reason: str, *, signum: int) -> None:
        super().__init__(reason)
        self.signum = signum
        self.exit_code = 128 + signum


class StopSignals:
    """A context that records the first of :data:`STOP_SIGNALS` received (``received``: its number)
    and puts the previous handlers back on exit."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum

    @property
    def name(self) -> str:
        """The received signal's name (``SIGTERM``), or an empty string."""
        return signal.Signals(self.received).name if self.received is not None else ""

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is signal.SIG_IGN:  # nohup's SIGHUP, a background job's SIGINT
                    continue
                self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

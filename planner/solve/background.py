"""One function run in a forked child process while the caller goes on.

Why: the homogeneous baselines (two more searches and their simulations) need nothing from the
main search, and on a 512-device cluster they take a third of the planning time; with a second
core they run beside the search instead of after it. Why a process and not a thread: the work is
pure Python, which the GIL serialises.

The answer never depends on where it ran: the function is deterministic, and any failure of the
child (no ``fork`` on this platform, one core, a child killed or an exception that does not pickle)
falls back to calling the function in the caller, which then raises what it raises.

    later = Deferred(homogeneous_baselines, profile, cluster, opts, background=True)
    ...                       # the caller's own work
    result = later.result()   # the child's answer, or the function run here
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Generic, TypeVar

__all__ = ["Deferred", "spare_core"]

T = TypeVar("T")


def spare_core() -> bool:
    """Whether this process may use a second core and can fork."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores >= 2 and "fork" in multiprocessing.get_all_start_methods()


class Deferred(Generic[T]):
    """``fn(*args)``, started in a forked child when ``background`` (and :func:`spare_core`), else
    run at :meth:`result`."""

    def __init__(self, fn: Callable[..., T], *args: Any, background: bool) -> None:
        self._fn, self._args = fn, args
        self._pool: ProcessPoolExecutor | None = None
        self._future: Future | None = None
        if background and spare_core():
            # what the parent has buffered would be written again by the child when it exits
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                self._pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork"))
                self._future = self._pool.submit(fn, *args)
            except (OSError, RuntimeError):  # no process to be had: run it here later
                self.close()

    def ready(self) -> bool:
        """Whether :meth:`result` would return without waiting for the child (it finished, or
        there is none: then :meth:`result` runs the function here): a caller with other work may
        do that first while the child is still busy."""
        return self._future is None or self._future.done()

    def result(self) -> T:
        """The function's value (from the child where it ran there and succeeded)."""
        future, self._future = self._future, None
        try:
            if future is not None:
                try:
                    return future.result()
                except Exception:  # any failure over there: the same call here says what
                    pass
            return self._fn(*self._args)
        finally:
            self.close()

    def close(self) -> None:
        """Stop the child (if any) without waiting for its answer."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # the executor has no public way to stop a running call; without this an error in the
        # caller would wait at exit for the child to finish its work
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            if process.is_alive():
                process.terminate()
            process.join()

"""Test processes forked from the fork server (torch imported once) instead of spawned fresh.

    spawn_ranks(worker, args=(init, folder), nprocs=2)     # as mp.spawn(worker, args=..., nprocs=2)

``torch.multiprocessing.spawn`` starts each process as a fresh Python that imports torch again
(2.5-3 s of CPU each, and ~1.7 s more at its first meta-device operation): with ten multi-process
tests of two to five processes, a minute or two of the suite. The fork server is the one the
launcher forks agents from (``AGENT_MODULES`` preloaded, the warm-up included), so the suite
starts it once. A forked process has the server's environment, not this one's: each gets this
process's environment (``GLOO_SOCKET_IFNAME`` set by a test, say) before it runs ``fn``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from hetplan.runtime.processes.agent_start import AGENT_MODULES

__all__ = ["spawn_ranks"]


def _entry(rank: int, fn: Callable[..., Any], env: dict[str, str], *args: Any) -> None:
    os.environ.clear()
    os.environ.update(env)
    fn(rank, *args)


def spawn_ranks(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1) -> None:
    """``fn(rank, *args)`` in ``nprocs`` processes, joined; a failure raises as ``mp.spawn``'s does."""
    mp.set_forkserver_preload(list(AGENT_MODULES))  # where the server has not started yet
    mp.start_processes(_entry, args=(fn, dict(os.environ), *args), nprocs=nprocs, join=True, start_method="forkserver")

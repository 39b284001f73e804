"""One rank forked from a fork server: the script behind ``torchrun --start-method forkserver --run-path``.

    HETPLAN_RANK_START=forkserver hetplan launch plan/ --steps 3     # ranks forked, torch already imported

torchrun's default starts each rank as a fresh ``python -m hetplan.runtime.worker``, which imports
torch again (about 2.5 s of CPU per rank). With ``HETPLAN_RANK_START=forkserver`` the launcher asks
torchrun's own agent to fork its ranks from a fork server instead (its ``--start-method forkserver
--run-path``), a single-threaded process that has imported what a rank needs once
(:func:`hetplan.runtime.launcher.rank_module_names`): same agent, same rendezvous, same failure
report. This script makes the forked rank look like one torchrun started itself (a session of its
own, which is how the launcher ends it by process group) and then runs the worker with the same
arguments.
"""

from __future__ import annotations

import io
import os
import sys

__all__ = ["main"]


def _unbuffered() -> None:
    """stdout and stderr written through at once, as ``python -u`` (torchrun's spawned ranks) has them:
    a rank that ends with ``os._exit`` loses nothing it printed."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        old = getattr(sys, name)
        raw = open(fd, "wb", buffering=0, closefd=False)  # noqa: SIM115 (the process's own stream, never closed)
        setattr(sys, name, io.TextIOWrapper(raw, encoding=old.encoding, errors=old.errors, write_through=True))


def main(argv: list[str] | None = None) -> None:
    """Lead a session of its own (torchrun's subprocesses do: ``start_new_session``), then be a worker."""
    if os.getsid(0) != os.getpid():
        os.setsid()
    _unbuffered()
    from hetplan.runtime.worker import main as worker_main

    worker_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()

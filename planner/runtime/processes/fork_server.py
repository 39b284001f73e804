"""Python's fork server started as a fork of the calling process, which has imported torch already.

    from hetplan.runtime.processes.fork_server import start_fork_server
    start_fork_server(["torch", "hetplan.runtime.worker"])   # before any thread of the caller's own starts

``multiprocessing``'s ``forkserver`` start method starts its server as a fresh Python
(``multiprocessing.forkserver.ensure_running``): the server then imports its preload modules again,
torch among them, about 4 s of CPU on a laptop-class core, once per launch. torchrun's agent has
imported torch before it starts its ranks, so a fork of the agent taken *before* its rendezvous
store starts its threads is the same single-threaded server at a fraction of the cost: the same
``multiprocessing.forkserver.main`` loop, the same socket and "alive" pipe, the agent's
``multiprocessing`` told where it is exactly as ``ensure_running`` tells it. Ranks are still forked
from the server, never from the agent (whose threads a fork could inherit mid-lock).

It reaches into ``multiprocessing.forkserver``'s private state (the three attributes
``ensure_running`` sets), so it runs only where that state and ``main``'s signature are the ones
it was written against (CPython 3.11's, checked at run time); elsewhere it answers False and the
caller starts the server the documented way. Only a speed-up: what the ranks see is the same.
"""

from __future__ import annotations

import inspect
import os
import socket

__all__ = ["short_socket_folder", "start_fork_server"]

#: The longest temporary folder ``multiprocessing`` may put its sockets' folder in: a UNIX socket's
#: path has at most 107 bytes, and ``multiprocessing`` adds ``/pymp-XXXXXXXX/listener-XXXXXXXX``.
_LONGEST_TEMP = 64

#: ``multiprocessing.forkserver.main``'s parameters this module calls it with (3.14 adds an authkey).
_MAIN_PARAMETERS = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")
_SERVER_STATE = ("_forkserver_address", "_forkserver_alive_fd", "_forkserver_pid", "_preload_modules", "_lock")


def short_socket_folder() -> None:
    """Make ``multiprocessing`` keep its sockets under ``/tmp`` where ``TMPDIR`` is too long for
    them. Its fork server listens on a socket in a folder under the temporary folder; a long
    ``TMPDIR`` (a test's own folder under pytest's) gives a path over the 107 bytes a UNIX socket may
    have, and every launch failed with "AF_UNIX path too long". Only the folder ``multiprocessing``
    creates moves; the run's own files stay where ``TMPDIR`` says."""
    import tempfile
    from multiprocessing import util

    if len(tempfile.gettempdir()) <= _LONGEST_TEMP or not os.path.isdir("/tmp"):
        return
    previous = tempfile.tempdir
    tempfile.tempdir = "/tmp"
    try:
        util.get_temp_dir()  # made once per process, kept for every later socket (and removed at exit)
    finally:
        tempfile.tempdir = previous


def _supported() -> bool:
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    if server is None or not all(hasattr(server, name) for name in _SERVER_STATE):
        return False
    return tuple(inspect.signature(forkserver.main).parameters) == _MAIN_PARAMETERS


def start_fork_server(preload: list[str]) -> bool:
    """Start this process's ``multiprocessing`` fork server as a fork of it, importing ``preload``
    there (what is imported here already costs nothing); True once it runs, False where this
    Python's ``multiprocessing`` is not the one this was written against or a server runs already
    (then nothing was done). Call it while this process runs a single thread of its own."""
    from multiprocessing import connection, forkserver, resource_tracker, spawn, util

    if not _supported():
        return False
    short_socket_folder()
    server = forkserver._forkserver
    with server._lock:
        if server._forkserver_pid is not None:
            return False
        resource_tracker.ensure_running()  # as ensure_running does: the ranks report to one tracker
        data = {k: v for k, v in spawn.get_preparation_data("ignore").items() if k in ("main_path", "sys_path")}
        address = connection.arbitrary_address("AF_UNIX")
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(address)
            if not util.is_abstract_socket_namespace(address):
                os.chmod(address, 0o600)
            listener.listen()
            alive_r, alive_w = os.pipe()
            # a forked agent holds its own fork server's "alive" pipe: neither this server nor the
            # ranks it forks should keep that one open (it would keep the outer server alive)
            inherited = server._forkserver_alive_fd
            pid = os.fork()
            if pid == 0:  # the server: it must not hold the pipe's write end, or it never sees its clients go
                code = 1  # a server that cannot serve ends; its clients see the socket go
                try:
                    os.close(alive_w)
                    if inherited is not None:
                        os.close(inherited)
                    forkserver.main(listener.fileno(), alive_r, preload, **data)
                except SystemExit:  # how main ends once every client has gone
                    code = 0
                finally:
                    os._exit(code)  # never the caller's exit handlers
            os.close(alive_r)
        server._forkserver_address = address
        server._forkserver_alive_fd = alive_w
        server._forkserver_pid = pid
        server._preload_modules = list(preload)
    return True

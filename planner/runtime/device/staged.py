"""Host-staged transport: gloo carries the traffic of ranks that compute on a GPU.

    staging = install_staging()       # in the rank's process, before the first collective
    ...                               # every dist.all_reduce / batch_isend_irecv / ... is staged
    staging.uninstall()

gloo moves host memory: it has no send or receive of CUDA tensors, and of the collectives only
all-reduce and broadcast take them. With the transport installed, each torch.distributed call the
runtime makes copies its device tensors to host buffers, runs on those, and copies what it received
back into the device tensors when the call completes (at once for a blocking call; when a
caller waits on the work of an asynchronous one). So several ranks can share one GPU (NCCL refuses
two ranks on one device), and GPUs that cannot share an NCCL communicator (two vendors, no peer
access) still train together, at host-copy speed: the simulator prices such links as a link class of
their own.

It works by wrapping the functions of ``torch.distributed`` that the runtime calls (and any alias
a runtime module took of one at import, as ZeRO-1 does), so every collective of every module is
staged without each carrying a branch of its own; object collectives and torch's own internals are
left alone. ``everything=True`` stages CPU tensors too (copied to a separate host buffer and back):
the CPU stand-in with which tests check on CPU that every result comes back to where the runtime
reads it (tests/runtime/test_host_staged.py). Tensor parallelism (DTensor's functional collectives)
does not go through these functions and is refused under this transport by the worker.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Staging", "install_staging"]

#: The torch.distributed functions the runtime calls with tensors, wrapped while staging.
_WRAPPED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "reduce",
    "broadcast",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
)


class _StagedWork:
    """A work whose results are copied back into the device tensors once it has completed."""

    def __init__(self, inner: Any, copy_back: Callable[[], None]) -> None:
        self._inner = inner
        self._copy_back: Callable[[], None] | None = copy_back

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        done = self._inner.wait(*args, **kwargs)
        if self._copy_back is not None:
            self._copy_back()
            self._copy_back = None
        return done

    def is_completed(self) -> bool:
        return bool(self._inner.is_completed())

    def __getattr__(self, name: str) -> Any:  # exception(), source_rank(), ...: the inner work's
        return getattr(self._inner, name)


class Staging:
    """The installed transport: what was wrapped, to put it back."""

    def __init__(self, *, everything: bool) -> None:
        self.everything = everything
        self.originals: dict[str, Callable[..., Any]] = {n: getattr(dist, n) for n in _WRAPPED}
        self._p2p_class = dist.P2POp
        self._isend_wrapper: Callable[..., Any] = self._isend
        self._irecv_wrapper: Callable[..., Any] = self._irecv
        self.patched: list[tuple[Any, str, Any]] = []  # (module, attribute, original)
        #: tensors staged so far (for tests: that the transport was used at all)
        self.staged = 0

    # -- staging one tensor --------------------------------------------------------------------------
    def _needs(self, t: torch.Tensor) -> bool:
        return self.everything or t.device.type != "cpu"

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        if not self._needs(t):
            return t
        self.staged += 1
        return t.detach().to("cpu", copy=True)

    def _back(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], None]:
        def copy() -> None:
            with torch.no_grad():
                for device_t, host_t in pairs:
                    if device_t is not host_t:
                        device_t.copy_(host_t)

        return copy

    def _finish(self, work: Any, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        copy = self._back(pairs)
        if work is None:  # a blocking call has completed
            copy()
            return None
        return _StagedWork(work, copy)

    # -- the wrapped calls ---------------------------------------------------------------------------
    def _inout(self, name: str) -> Callable[..., Any]:
        """A call whose first argument is read and written in place (all_reduce, broadcast, ...)."""
        original = self.originals[name]

        def call(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            host = self._host(tensor)
            return self._finish(original(host, *args, **kwargs), [(tensor, host)])

        return call

    def _send(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self.originals["send"](self._host(tensor), *args, **kwargs)

    def _recv(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        host = self._host(tensor)
        src = self.originals["recv"](host, *args, **kwargs)
        self._back([(tensor, host)])()
        return src

    def _p2p_op(self, op: Any, tensor: torch.Tensor, peer: int | None = None, group: Any = None, tag: int = 0) -> Any:
        """``dist.P2POp`` of the wrapped isend/irecv: torch checks the operation is its own function,
        so the wrapper is swapped for the original (``batch_isend_irecv`` stages the tensors)."""
        unwrapped = {id(self._isend_wrapper): self.originals["isend"], id(self._irecv_wrapper): self.originals["irecv"]}
        return self._p2p_class(unwrapped.get(id(op), op), tensor, peer, group, tag)

    def _isend(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        host = self._host(tensor)  # kept alive by the work until it completes
        return _StagedWork(self.originals["isend"](host, *args, **kwargs), self._back([(host, host)]))

    def _irecv(self, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        host = self._host(tensor)
        return _StagedWork(self.originals["irecv"](host, *args, **kwargs), self._back([(tensor, host)]))

    def _out_in(self, name: str) -> Callable[..., Any]:
        """``f(output, input, ...)``: output written (a tensor or a list of them), input read."""
        original = self.originals[name]

        def call(output: Any, input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            outs = list(output) if isinstance(output, (list, tuple)) else [output]
            hosts = [self._host(t) for t in outs]
            host_out: Any = hosts if isinstance(output, (list, tuple)) else hosts[0]
            work = original(host_out, self._host(input), *args, **kwargs)
            return self._finish(work, list(zip(outs, hosts, strict=True)))

        return call

    def _batch(self, ops: list[dist.P2POp]) -> list[Any]:
        staged, pairs = [], []
        for op in ops:
            host = self._host(op.tensor)
            staged.append(self._p2p_op(op.op, host, op.peer, op.group, op.tag))
            pairs.append([(op.tensor, host)] if op.op is self.originals["irecv"] else [])
        works = self.originals["batch_isend_irecv"](staged)
        if len(works) == len(ops):  # one work per operation (gloo): each copies back its own receive
            return [_StagedWork(w, self._back(p)) for w, p in zip(works, pairs, strict=True)]
        everything = [pair for p in pairs for pair in p]  # one work for the batch (coalesced)
        return [_StagedWork(w, self._back(everything)) for w in works]

    # -- installing ----------------------------------------------------------------------------------
    def wrappers(self) -> dict[str, Callable[..., Any]]:
        return {
            "all_reduce": self._inout("all_reduce"),
            "broadcast": self._inout("broadcast"),
            "reduce": self._inout("reduce"),
            "all_gather": self._out_in("all_gather"),
            "all_gather_into_tensor": self._out_in("all_gather_into_tensor"),
            "reduce_scatter_tensor": self._out_in("reduce_scatter_tensor"),
            "send": self._send,
            "recv": self._recv,
            "isend": self._isend_wrapper,
            "irecv": self._irecv_wrapper,
            "batch_isend_irecv": self._batch,
        }

    def install(self) -> Staging:
        wrappers = self.wrappers()
        by_original = {id(self.originals[n]): w for n, w in wrappers.items()}
        for name, wrapper in wrappers.items():
            self.patched.append((dist, name, self.originals[name]))
            setattr(dist, name, wrapper)
        self.patched.append((dist, "P2POp", self._p2p_class))
        dist.P2POp = self._p2p_op  # type: ignore[assignment,misc]  # P2POp(dist.isend, ...) takes the wrapper
        # a runtime module that took an alias of one of them at import (zero.py does)
        for mod_name, module in list(sys.modules.items()):
            if not mod_name.startswith("hetplan.runtime") or module is None:
                continue
            for attr, value in list(vars(module).items()):
                wrapper = by_original.get(id(value))
                if wrapper is not None and value is not dist:
                    self.patched.append((module, attr, value))
                    setattr(module, attr, wrapper)
        return self

    def uninstall(self) -> None:
        for module, attr, original in reversed(self.patched):
            setattr(module, attr, original)
        self.patched.clear()


def install_staging(*, everything: bool = False) -> Staging:
    """Stage every collective and transfer of this process through host memory (see the module)."""
    return Staging(everything=everything).install()

"""HetPipe's Wave Synchronous Parallel: a parameter server with a clock per wave and a staleness bound.

    server = ParamServer(params, layouts, optimizer=make_optimizer("adam", ...))   # its own process
    server.serve()                                   # until every worker has said stop

    client = PsClient(server_rank, numel, rank=dist.get_rank())  # in each worker (every device of every pipeline)
    client.push(clock, flat_grad, overflow=False)    # the wave's unscaled gradient of this device's blocks
    reply = client.pull(min_version)                 # the newest weights, at least ``min_version``
    client.stop()

**Clocks and versions.** Every worker finishes waves ``0, 1, 2, ...`` and pushes each wave's
gradient for the parameters it holds (unscaled fp32, already weighted as for the all-reduce: the sum
over every push of one clock is the whole model's gradient of that wave). When every worker has
pushed clock ``c`` and the server holds version ``c`` (``c`` clocks applied), it takes one optimizer
step with the summed gradient: version ``c + 1``. A worker that finished wave ``c`` pulls with
``min_version = c + 1 - D``: the server answers with its newest weights once it has at least that
version, and holds the answer back until then. So a worker starting wave ``c + 1`` has every update
of waves ``<= c - D``: every worker has finished wave ``c - D``, and none is more than ``D`` waves
ahead of the slowest (HetPipe's global staleness bound). ``D = 0`` is synchronous training: each wave
starts from the weights of every earlier wave's summed gradient, exactly what the all-reduce gives,
for any optimizer (the server steps once per clock on the sum, never per push). The worker's own
updates of the waves the server has not applied yet are its business (:class:`~hetplan.runtime.
wave_sync.WaveSync` adds them back onto what it pulls).

**The optimizer and its state live here**, once, in fp32: HetPipe's server adds the workers' pushed
updates; this one steps the plan's optimizer on the clock's summed gradient instead, so that ``D = 0``
is synchronous training for Adam too and a checkpoint holds one optimizer state.

**Overflow** (fp16): a push says whether its wave had a step whose gradient overflowed in the
worker's pipeline (the gradient it pushes then leaves those steps out). The server does not step a
clock any push of which overflowed: every worker's update of that clock is skipped, everywhere, as
the all-reduce skips a step on every rank; the version still advances, and a pull's reply says how
many clocks were skipped so far, so each worker backs its loss scale off for the others' overflows.

**Clipping** is exact: the server holds the whole gradient of a clock, so its global norm is the
norm of one process's gradient. **Messages** go over torch.distributed point-to-point calls of the
default group with their own tag (:data:`TAG`, apart from the pipeline's transfer tags; the server
receives from any source): a header ``[kind, clock or version, rank, numel, overflow]`` (int64), then
the payload (fp32, on CPU: :func:`to_host`; a pull's reply header is ``[version, numel of every
worker together, clocks skipped, 0, 0]``). The server is a process of its own (the launcher starts it
beside the ranks): a worker never waits on another worker, only on the server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["HEADER", "PULL", "PUSH", "STOP", "TAG", "ParamServer", "PsClient", "Pulled", "ServerLog", "to_host"]

PUSH, PULL, STOP = 1, 2, 3
#: The tag of every parameter-server message (pipeline transfers use small tags: ``comm.tag_of``).
TAG = 1 << 20
#: int64 fields of every header and reply
HEADER = 5


def to_host(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a contiguous fp32 CPU tensor (a copy when ``t`` is on a GPU): every exchange with the
    central process, and SDPipe's weight swap, moves CPU tensors, so under the device-type backend
    map ``cpu:gloo,cuda:nccl`` (worker.process_group_backend) they go over gloo while the pipeline's
    CUDA tensors go over NCCL; the central process holds no GPU."""
    return t.detach().float().cpu().contiguous()


@dataclass
class ServerLog:
    """What the server saw, for the run log and for tests of the staleness bound."""

    steps: list[int] = field(default_factory=list)  # clocks stepped, in order
    pulls: list[tuple[int, int, int, int]] = field(default_factory=list)  # (rank, asked, given, latest clock pushed)
    pushes: list[tuple[int, int]] = field(default_factory=list)  # (rank, clock) in arrival order
    skipped: list[int] = field(default_factory=list)  # clocks not stepped: a push of theirs overflowed


@dataclass(frozen=True)
class Pulled:
    """A pull's answer: the server's version (clocks applied), this worker's weights (CPU fp32), and
    how many of those clocks were skipped for an overflow."""

    version: int
    flat: torch.Tensor
    skipped: int


class ParamServer:
    """Holds the model's fp32 weights and optimizer; steps once per clock on the summed gradient.

    ``layouts`` maps each worker's rank to the names of the parameters it holds, in the order of
    its flat buffers; several workers may hold one parameter (replicas, pipelines): their pushes add.
    ``before_step(grads)`` may return a factor every gradient is multiplied by (global-norm clipping).
    """

    def __init__(
        self,
        params: Mapping[str, torch.nn.Parameter],
        layouts: Mapping[int, Sequence[str]],
        *,
        optimizer: torch.optim.Optimizer,
        before_step: Callable[[list[torch.Tensor]], float] | None = None,
        version: int = 0,
        checkpoints: Mapping[int, Callable[[], None]] | None = None,
    ) -> None:
        """``version``: the clocks already stepped (a resumed run's, restored with the weights and
        state). ``checkpoints``: version -> a save to run once the server holds that version and
        every worker's pull after pushing the clock before it is answered: the workers then wait in
        the same collective save, and no message is in flight."""
        self.params = dict(params)
        self.layouts = {r: list(names) for r, names in layouts.items()}
        self.optimizer = optimizer
        self.before_step = before_step
        self.version = version
        self.checkpoints = dict(checkpoints or {})
        self._answered_after: dict[int, int] = {}  # rank -> the latest clock it had pushed when last answered
        self.log = ServerLog()
        # per open clock, one dense fp32 buffer of every parameter (``_offsets``): a fixed 4 bytes a
        # parameter per open clock, whichever devices' payloads overlap (what the walk prices)
        self._sums: dict[int, torch.Tensor] = {}
        self._offsets: dict[str, int] = {}
        self._elements = 0
        for name, p in self.params.items():
            self._offsets[name] = self._elements
            self._elements += p.numel()
        self._pushed: dict[int, set[int]] = {}
        self._latest_push: dict[int, int] = {}
        self._waiting: list[tuple[int, int]] = []  # (rank, min_version)
        self._overflowed: set[int] = set()  # clocks a push of which overflowed (fp16)
        self._total = sum(self._numel(r) for r in self.layouts)
        self._held = {name for names in self.layouts.values() for name in names}
        self._running = set(self.layouts)  # workers that have not sent STOP

    def _numel(self, rank: int) -> int:
        return sum(self.params[n].numel() for n in self.layouts[rank])

    def serve(self, *, until_version: int | None = None) -> None:
        """Answer pushes and pulls until every worker has sent STOP (or, with ``until_version``,
        until the server holds that version: a later call goes on where this one stopped)."""
        header = torch.zeros(HEADER, dtype=torch.int64)
        while self._running and (until_version is None or self.version < until_version):
            src = dist.recv(header, src=None, tag=TAG)
            kind, value, rank = int(header[0]), int(header[1]), int(header[2])
            if rank not in self.layouts or src != rank:
                raise RuntimeError(f"parameter server: a message from rank {src} says it is from rank {rank}")
            if kind == PUSH:
                payload = torch.empty(self._numel(rank), dtype=torch.float32)
                dist.recv(payload, src=src, tag=TAG)
                self._add(rank, value, payload)
                del payload  # added into the clock's buffer: not beside the optimizer's step
                if int(header[4]):
                    self._overflowed.add(value)
                self._advance()
            elif kind == PULL:
                self._waiting.append((rank, value))
            elif kind == STOP:
                self._running.discard(rank)
            else:
                raise RuntimeError(f"parameter server: unknown message kind {kind} from rank {rank}")
            self._answer()
            self._checkpoint()
        if not self._running and self._waiting:
            raise RuntimeError(f"parameter server: pulls left unanswered at stop: {self._waiting}")

    def _add(self, rank: int, clock: int, flat: torch.Tensor) -> None:
        if clock < self.version:
            raise RuntimeError(f"parameter server: rank {rank} pushed clock {clock}, already stepped past it")
        total = self._sums.get(clock)
        if total is None:
            total = self._sums[clock] = torch.zeros(self._elements, dtype=torch.float32)
        offset = 0
        for name in self.layouts[rank]:
            n = self.params[name].numel()
            at = self._offsets[name]
            total[at : at + n].add_(flat[offset : offset + n])
            offset += n
        self._pushed.setdefault(clock, set()).add(rank)
        self._latest_push[rank] = clock
        self.log.pushes.append((rank, clock))

    def _advance(self) -> None:
        """Step every clock that is complete, in clock order."""
        while self._pushed.get(self.version, set()) == set(self.layouts):
            total = self._sums.pop(self.version)
            del self._pushed[self.version]
            if self.version in self._overflowed:  # skipped everywhere: no worker's update of it counts
                self._overflowed.discard(self.version)
                self.log.skipped.append(self.version)
                self.version += 1
                continue
            sums = {
                name: total[self._offsets[name] : self._offsets[name] + p.numel()].view_as(p)
                for name, p in self.params.items()
                if name in self._held
            }
            factor = self.before_step(list(sums.values())) if self.before_step else 1.0
            for name, p in self.params.items():
                p.grad = sums[name].mul_(factor) if name in sums else None  # views of the clock's own buffer
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.log.steps.append(self.version)
            self.version += 1

    def _checkpoint(self) -> None:
        """Run the save of the version held, once every worker is answered after its last push."""
        save = self.checkpoints.get(self.version)
        if save is None or self._waiting:
            return
        if all(self._answered_after.get(r, -1) == self.version - 1 for r in self.layouts):
            del self.checkpoints[self.version]
            save()

    def _answer(self) -> None:
        still = []
        for rank, min_version in self._waiting:
            if self.version < min_version:
                still.append((rank, min_version))
                continue
            # the reply says how many elements every worker moves (for the pacing of emulated links)
            reply = torch.tensor([self.version, self._total, len(self.log.skipped), 0, 0], dtype=torch.int64)
            dist.send(reply, dst=rank, tag=TAG)
            flat = torch.cat([self.params[n].detach().flatten() for n in self.layouts[rank]])
            dist.send(flat.float().contiguous(), dst=rank, tag=TAG)
            self.log.pulls.append((rank, min_version, self.version, self._latest_push.get(rank, -1)))
            self._answered_after[rank] = self._latest_push.get(rank, -1)
        self._waiting = still


class PsClient:
    """A worker's side: push a wave's flat gradient, pull the newest weights it may use, stop."""

    def __init__(self, server: int, numel: int, *, rank: int) -> None:
        self.server = server
        self.numel = numel
        self.rank = rank
        self.total_numel = 0  # every worker's elements together, from the first pull's reply

    @property
    def total_bytes(self) -> int:
        """Bytes every worker pushes in one clock (fp32), as the server said (0 before a pull)."""
        return 4 * self.total_numel

    def _header(self, kind: int, value: int, flags: int = 0) -> None:
        header = torch.tensor([kind, value, self.rank, self.numel, flags], dtype=torch.int64)
        dist.send(header, dst=self.server, tag=TAG)

    def push(self, clock: int, flat_grad: torch.Tensor, *, overflow: bool = False) -> None:
        """The wave's unscaled gradient; ``overflow``: a step of the wave overflowed (the server
        then skips the clock for every worker)."""
        if flat_grad.numel() != self.numel:
            raise ValueError(f"expected {self.numel} gradient elements, got {flat_grad.numel()}")
        self._header(PUSH, clock, int(overflow))
        dist.send(to_host(flat_grad), dst=self.server, tag=TAG)

    def pull(self, min_version: int, *, out: torch.Tensor | None = None) -> Pulled:
        """The newest weights of at least ``min_version`` (a CPU tensor: the caller copies it to its
        device); ``out``: a contiguous fp32 CPU buffer of ``numel`` to receive them in (no new one)."""
        self._header(PULL, max(0, min_version))
        reply = torch.zeros(HEADER, dtype=torch.int64)
        dist.recv(reply, src=self.server, tag=TAG)
        flat = out if out is not None else torch.empty(self.numel, dtype=torch.float32)
        dist.recv(flat, src=self.server, tag=TAG)
        self.total_numel = int(reply[1])
        return Pulled(int(reply[0]), flat, int(reply[2]))

    def stop(self) -> None:
        self._header(STOP, 0)

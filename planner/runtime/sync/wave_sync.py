"""A device's side of the two decentralised sync modes, called once per step after its backward.

    wsp = WaveSync(PsClient(...), wave=2, staleness=1)
    step = wsp.after_step(step, flat_weights, flat_grad, lr=lr, to_mean=B / n)  # flat_grad None: overflow
    load(step.weights)                            # locally updated; at a wave's end, pulled (+ own waves)

    avg = GroupAverage(GroupClient(...), pipeline=p, peers={q: rank}, batches={q: b_q})
    weights = avg.after_step(step, flat_weights)  # the weighted average over this round's group

**WSP** (HetPipe, Park et al., ATC 2020): every step the device updates its LOCAL weights with its
own gradient (HetPipe's local update: plain SGD at the step's learning rate on the device's mean
gradient, ``to_mean`` x the gradient as weighted for the all-reduce), so a virtual worker's later
steps of a wave see its earlier ones; it adds each step's gradient (unscaled, fp32) to the wave's
sum. At the end of a wave of ``wave`` steps it pushes the sum to the parameter server
(:mod:`hetplan.runtime.sync.param_server`), which steps the plan's optimizer once per clock on every
worker's sum, and pulls the newest weights the staleness bound lets it use (``min_version = clock +
1 - staleness``: it waits only when it would run more than ``D`` waves ahead of the slowest). Onto
them it adds its own local updates of the waves the pulled version does not hold yet (at most
``D``): a fast worker keeps seeing its own last waves, as with HetPipe's server, which adds every push
on arrival. With ``wave = 1, staleness = 0`` the pulled version holds every earlier clock and
nothing is added back: synchronous training, step for step, for any optimizer.

Where the state lives: the optimizer and its state on the server (one copy, fp32, checkpointed
there); on the device its weights (and fp32 master under fp16/bf16), the wave's gradient sum and,
under ``D > 0`` only, the current wave's local update and the local updates of at most ``D`` pushed
waves not yet pulled back (all flat fp32 of the device's parameters; ``D = 0`` never adds one back).
A step whose gradient overflowed in the device's pipeline (fp16) is left out of the sum and of the
local update, and the push says so: the server then skips the clock for everyone
(:class:`~hetplan.runtime.sync.param_server.ParamServer`).

**SDPipe**: the device's pipeline has stepped its own optimizer; the device tells the group
scheduler it is ready (:mod:`hetplan.runtime.sync.group_scheduler`), learns the round's group, and swaps
its blocks' weights with its counterparts in the other pipelines of the group (the device of the same
stage, replica and shard: the pipelines of an SDPipe plan share one structure), point to point, all
at once; then every member takes the batch-share-weighted average, adding in pipeline order so every
member holds the same bits.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from hetplan.runtime.device.pacing import CENTRAL, LinkPacer
from hetplan.runtime.sync.group_scheduler import GroupClient
from hetplan.runtime.sync.param_server import PsClient, to_host

__all__ = ["AVERAGE_CHUNK", "AVERAGE_TAG", "GroupAverage", "WaveSync"]

#: The tag of the group averaging's weight exchange (apart from transfers and the central roles').
AVERAGE_TAG = (1 << 20) + 2
#: Elements per chunk of the group average, summed in float64 (16 bytes an element of a chunk: the
#: sum and one member's float64 copy); the memory walk prices it
#: (``hetplan.simulate.memory.AVERAGE_CHUNK``, which must equal it)
AVERAGE_CHUNK = 1 << 16


@dataclass(frozen=True)
class WaveStep:
    """What :meth:`WaveSync.after_step` gives back: the device's weights for its next step."""

    weights: torch.Tensor  # flat fp32, on the device of the weights passed in
    pulled: bool = False  # a wave's end: pulled from the server (plus this device's own unapplied waves)
    skipped: bool = False  # at a pull: a clock it newly covers was skipped (D = 0, wave 1: this step's)
    backoff: int = 0  # at a pull: clocks skipped for other workers' overflows since the last pull


@dataclass
class WaveSync:
    """WSP on one device: local updates every step, the wave's gradient pushed, the bound's pull."""

    client: PsClient
    wave: int
    staleness: int
    log: list[dict[str, int]] = field(default_factory=list)  # per wave: clock, version pulled, waves ahead
    _sum: torch.Tensor | None = None  # the wave's unscaled gradient
    _local: torch.Tensor | None = None  # the wave's local update (added to the weights step by step)
    _own: dict[int, torch.Tensor] = field(default_factory=dict)  # clock -> its local update, not yet pulled
    _overflow: bool = False  # a step of this wave overflowed in this device's pipeline
    _flagged: set[int] = field(default_factory=set)  # clocks this device pushed as overflowed, not yet pulled
    _skipped_seen: int = 0  # the server's count of skipped clocks at the last pull

    def start(self) -> torch.Tensor:
        """The server's initial weights (version 0): every device starts from the same ones."""
        return self.client.pull(0).flat

    def after_step(
        self,
        step: int,
        weights: torch.Tensor,
        grad: torch.Tensor | None,
        *,
        lr: float,
        to_mean: float,
        donate: bool = False,
    ) -> WaveStep:
        """After step ``step``'s backward: ``weights`` are the device's flat fp32 weights, ``grad`` its
        unscaled gradient (weighted as for the all-reduce) or None if the step overflowed.

        ``donate``: the caller hands both buffers over (fresh flat copies it does not read again):
        the local update goes into ``weights`` in place, a wave's first gradient becomes the wave's
        sum without a copy, and a pull lands in ``weights``. The device then holds, beside its model,
        the two flat buffers, the wave's earlier sum (``wave > 1``), the wave's local update and at
        most ``D`` own waves (``staleness D > 0``): what the memory walk prices
        (``hetplan.simulate.memory.sync_buffers``)."""
        if grad is None:
            self._overflow = True
        else:
            weights = self._accumulate(weights if donate else weights.clone(), grad, -lr * to_mean, donate=donate)
        if (step + 1) % self.wave:
            return WaveStep(weights)
        clock = step // self.wave
        self.client.push(
            clock, self._sum if self._sum is not None else torch.zeros_like(weights), overflow=self._overflow
        )
        if self._local is not None and not self._overflow:  # an overflowed wave is skipped by the server
            self._own[clock] = self._local
        if self._overflow:
            self._flagged.add(clock)
        self._sum, self._local, self._overflow = None, None, False
        min_version = clock + 1 - self.staleness
        for c in [c for c in self._own if c < min_version]:  # the pull will hold them: drop them now
            del self._own[c]
        # donated: the pulled weights land in the caller's buffer (received there on the host, copied
        # there from the host buffer on a GPU): no second copy of them on the device
        into = weights if donate and weights.device.type == "cpu" else None
        reply = self.client.pull(min_version) if into is None else self.client.pull(min_version, out=into)
        version = reply.version
        if donate:
            flat = weights if reply.flat is weights else weights.copy_(reply.flat)
        else:
            flat = reply.flat.to(weights.device)
        for c in sorted(self._own):  # the pulled version holds clocks < version; add back the later ones
            if c < version:
                del self._own[c]
            else:
                flat.add_(self._own[c])
        own_new = {c for c in self._flagged if c < version}
        self._flagged -= own_new
        newly = reply.skipped - self._skipped_seen  # clocks skipped among those this pull newly covers
        backoff = max(0, newly - len(own_new))
        self._skipped_seen = reply.skipped
        # the next wave (clock + 1) starts from ``version`` clocks: it misses clock + 1 - version of them
        self.log.append(
            {"clock": clock, "version": version, "waves_ahead": clock + 1 - version, "own_waves": len(self._own)}
        )
        return WaveStep(flat, pulled=True, skipped=newly > 0, backoff=backoff)

    def _accumulate(self, weights: torch.Tensor, grad: torch.Tensor, alpha: float, *, donate: bool) -> torch.Tensor:
        """The local update ``weights += alpha g`` (in place; returns ``weights``), ``g`` added to the
        wave's sum and, where a pull may lack this wave (``staleness > 0``), to the wave's local
        update. Under ``staleness 0`` a pull always holds every earlier wave, so the local update is
        never added back and not kept."""
        g = grad.detach().float()
        weights.add_(g, alpha=alpha)
        if self.staleness > 0:
            self._local = g * alpha if self._local is None else self._local.add_(g, alpha=alpha)
        if self._sum is None:
            self._sum = g if donate else g.clone()
        else:
            self._sum.add_(g)
        return weights

    def state_tensors(self) -> list[torch.Tensor]:
        """What this keeps from step to step (for memory accounting): the wave's sum and local
        update while a wave runs, and the own waves not yet pulled back."""
        kept = [t for t in (self._sum, self._local) if t is not None]
        return kept + list(self._own.values())

    def stop(self) -> None:
        self.client.stop()


@dataclass
class GroupAverage:
    """SDPipe on one device: after each local step, average with this round's group."""

    client: GroupClient
    pipeline: int
    peers: Mapping[int, int]  # pipeline -> the rank of this device's counterpart there
    batches: Mapping[int, int]
    timeout_s: float = 300.0
    log: list[tuple[int, ...]] = field(default_factory=list)  # the group of each step
    #: emulated slow links: the pacer of this device and the address of its counterpart per pipeline
    pacer: LinkPacer | None = None
    addresses: Mapping[int, str] = field(default_factory=dict)

    def after_step(self, step: int, flat_weights: torch.Tensor) -> torch.Tensor:
        """The group's batch-share-weighted average of ``flat_weights`` (fp32, on ``flat_weights``'
        device): exchanged as CPU tensors (:func:`to_host`), so they go over gloo under NCCL too."""
        asked = time.perf_counter()
        group = self.client.ready(step)
        if self.pacer is not None:  # the header out and the answer back, on an emulated path
            link = self.pacer.link_to(CENTRAL)
            if link is not None:
                self.pacer.pad(asked, link.transfer_time(8 * 4) + link.transfer_time(8 * self.client.width))
        self.log.append(group)
        others = [q for q in group if q != self.pipeline]
        if not others:
            return flat_weights
        mine = to_host(flat_weights)
        received = {q: torch.empty_like(mine) for q in others}
        ops = [dist.P2POp(dist.isend, mine, self.peers[q], tag=AVERAGE_TAG) for q in others]
        ops += [dist.P2POp(dist.irecv, received[q], self.peers[q], tag=AVERAGE_TAG) for q in others]
        posted = time.perf_counter()
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        if self.pacer is not None:  # the simulator's swap: one transfer of the weights per partner
            self.pacer.pad(posted, self.swap_floor(others, 4 * mine.numel()))
        received[self.pipeline] = mine
        total = sum(self.batches[q] for q in group)
        # the average goes into a buffer a partner's weights came in, chunk by chunk once the chunk
        # is summed: no output buffer beside the received ones, no whole-vector float64 copy
        out = received[others[0]]
        for lo in range(0, mine.numel(), AVERAGE_CHUNK):
            hi = lo + AVERAGE_CHUNK
            acc = torch.zeros(min(hi, mine.numel()) - lo, dtype=torch.float64)
            for q in group:  # ascending pipeline order on every member: the same bits on each
                acc.add_(received[q][lo:hi].double().mul_(self.batches[q] / total))
            out[lo:hi].copy_(acc)
        return out.to(device=flat_weights.device, dtype=torch.float32)

    def swap_floor(self, others: list[int], nbytes: float) -> float:
        """The least time of the weight swap with ``others``: per partner whose path is emulated,
        its bytes over that link plus a latency (``_decentralised_exchange``: ``(group - 1)`` such
        transfers), added up."""
        assert self.pacer is not None
        links = [self.pacer.link_to(self.addresses[q]) for q in others if q in self.addresses]
        return sum(link.transfer_time(nbytes) for link in links if link is not None)

    def stop(self) -> None:
        self.client.stop()

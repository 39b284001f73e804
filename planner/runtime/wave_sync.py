"""A device's side of the two decentralised sync modes, called once per step after its backward.

    wsp = WaveSync(PsClient(...), wave=2, staleness=1)
    weights = wsp.after_step(step, flat_grad)     # None inside a wave; the pulled weights at its end

    avg = GroupAverage(GroupClient(...), pipeline=p, peers={q: rank}, batches={q: b_q})
    weights = avg.after_step(step, flat_weights)  # the weighted average over this round's group

**WSP** (HetPipe): the device adds each step's gradient (already weighted as for the all-reduce) to
the wave's sum; at the end of a wave of ``wave`` steps it pushes the sum to the parameter server
(:mod:`hetplan.runtime.param_server`) and pulls the newest weights the staleness bound lets it use
(``min_version = clock + 1 - staleness``). Inside a wave the weights do not change (no local
update): with ``wave = 1, staleness = 0`` this is synchronous training, step for step. The optimizer
and its state live on the server.

**SDPipe**: the device's pipeline has stepped its own optimizer; the device tells the group
scheduler it is ready (:mod:`hetplan.runtime.group_scheduler`), learns the round's group, and swaps
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

from hetplan.runtime.group_scheduler import GroupClient
from hetplan.runtime.pacing import CENTRAL, LinkPacer
from hetplan.runtime.param_server import PsClient, to_host

__all__ = ["AVERAGE_TAG", "GroupAverage", "WaveSync"]

#: The tag of the group averaging's weight exchange (apart from transfers and the central roles').
AVERAGE_TAG = (1 << 20) + 2


@dataclass
class WaveSync:
    """WSP on one device: accumulate the wave's gradient, push it, pull what the bound allows."""

    client: PsClient
    wave: int
    staleness: int
    log: list[dict[str, int]] = field(default_factory=list)  # per wave: clock, version pulled, waves ahead
    _sum: torch.Tensor | None = None

    def start(self) -> torch.Tensor:
        """The server's initial weights (version 0): every device starts from the same ones."""
        _, flat = self.client.pull(0)
        return flat

    def after_step(self, step: int, flat_grad: torch.Tensor) -> torch.Tensor | None:
        grad = flat_grad.detach().float()
        self._sum = grad.clone() if self._sum is None else self._sum.add_(grad)
        if (step + 1) % self.wave:
            return None
        clock = step // self.wave
        self.client.push(clock, self._sum)
        self._sum = None
        version, flat = self.client.pull(clock + 1 - self.staleness)
        # the next wave (clock + 1) starts from ``version`` updates: it misses clock + 1 - version waves
        self.log.append({"clock": clock, "version": version, "waves_ahead": clock + 1 - version})
        return flat

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
        out = torch.zeros_like(mine, dtype=torch.float64)
        for q in group:  # ascending pipeline order on every member
            out += received[q].double() * (self.batches[q] / total)
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

"""Emulated slow links: every transfer and collective on one takes at least what its bytes need.

    pacer = LinkPacer(config, address, enabled=emulate)
    started = time.perf_counter(); ...post and wait...
    pacer.pad(started, pacer.p2p_floor([(peer, nbytes), ...]))   # sleeps what is left, if anything
    pacer.pad(issued, pacer.collective_floor(devices, nbytes, "allreduce"))
    pacer.pad(started, pacer.central_exchange_floor(devices, total_bytes))   # wsp: a wave's push + pull

A local cluster may mark links ``emulate: true`` (the cluster contract); the rank config then lists
them (``emulated_links``) and, under ``--emulate``, each rank makes whatever crosses one last at least
the alpha-beta time of its bytes on the link's stated bandwidth and latency: a batch of transfers the
sum of its bytes per link (they share it) plus one latency, a ring all-reduce
:meth:`hetplan.contracts.cluster.Link.ring_allreduce_time` on the slowest emulated link between its
members (the formula the simulator uses), an all-gather or a reduce-scatter (ZeRO-1) half of that
for its total bytes, a wave's push and pull through the ``wsp`` parameter server the simulator's
``2 (bytes of every device / bandwidth + latency)`` on the slowest emulated path to the central
process (:meth:`LinkPacer.central_exchange_floor`). The real
transfer runs first; the rank sleeps only what is left, so a link is never faster than stated and
never slower than the machine makes it. This is emulation, labelled so in the run log.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from hetplan.contracts.cluster import Link
from hetplan.contracts.rank_config import RankConfig

__all__ = ["CENTRAL", "LinkPacer"]

#: The address of the central process of ``wsp`` / ``sdpipe`` (the rank config places it on its
#: ``central.node``; :data:`hetplan.runtime.sync.central.CENTRAL` is the same name).
CENTRAL = "central"


class LinkPacer:
    """Floors for one rank's transfers and collectives on emulated links (none when disabled)."""

    def __init__(self, config: RankConfig, address: str, *, enabled: bool) -> None:
        self.config = config
        self.address = address
        self.enabled = enabled and bool(config.emulated_links)
        self.slept_s = 0.0  # what pacing added, for the run log

    def link_to(self, peer: str) -> Link | None:
        return self.config.emulated_link(self.address, peer) if self.enabled else None

    def p2p_floor(self, transfers: Iterable[tuple[str, float]]) -> float:
        """The least time a batch of ``(peer, bytes)`` takes: per emulated link, its bytes over its
        bandwidth plus one latency; the slowest link sets the batch's floor."""
        if not self.enabled:
            return 0.0
        per_link: dict[Link, float] = {}
        for peer, nbytes in transfers:
            link = self.link_to(peer)
            if link is not None:
                per_link[link] = per_link.get(link, 0.0) + nbytes
        return max((link.transfer_time(b) for link, b in per_link.items()), default=0.0)

    def collective_floor(self, devices: Sequence[str], nbytes: float, kind: str) -> float:
        """The least time of a collective over ``devices``: a ring on the slowest emulated link
        between any two of them; ``kind`` is ``allreduce`` or ``allgather`` (``nbytes`` its total)."""
        if not self.enabled or len(devices) < 2:
            return 0.0
        links = [
            link
            for i, a in enumerate(devices)
            for b in devices[i + 1 :]
            if (link := self.config.emulated_link(a, b)) is not None
        ]
        if not links:
            return 0.0
        slowest = min(links, key=lambda x: (x.bandwidth, -x.latency))
        ring = slowest.ring_allreduce_time(nbytes, len(devices))
        return ring if kind == "allreduce" else ring / 2.0

    def central_exchange_floor(self, devices: Sequence[str], total_bytes: float) -> float:
        """The least time of one ``wsp`` wave exchange (push the gradient, pull the weights) of this
        rank: ``2 (total_bytes / bandwidth + latency)`` on the slowest emulated path from any of
        ``devices`` to the central process, as the simulator's ``_decentralised_exchange`` (every
        device's bytes go through the central process's link, all at once, and each waits for the
        whole exchange), when this rank's own path to it is emulated; 0 when it is not (its bytes
        cross no emulated link)."""
        if not self.enabled or self.link_to(CENTRAL) is None:
            return 0.0
        paths = [link for a in devices if (link := self.config.emulated_link(a, CENTRAL)) is not None]
        slowest = min(paths, key=lambda x: (x.bandwidth, -x.latency))
        return 2.0 * (total_bytes / slowest.bandwidth + slowest.latency)

    def pad(self, started: float, floor: float) -> float:
        """Sleep until ``floor`` seconds have passed since ``started`` (perf_counter); the sleep."""
        left = floor - (time.perf_counter() - started)
        if left > 0:
            time.sleep(left)
            self.slept_s += left
            return left
        return 0.0

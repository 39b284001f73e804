"""The cost model's terms, each named after what it models (see docs/cost-model.md).

costs = CostModel(profile, cluster, optimizer="adam")
costs.compute(device, start=0, end=9, samples=4, backward=False)   # seconds
costs.allreduce(group_bytes, devices)                               # seconds
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from hetplan.contracts.cluster import Cluster, Device, Link
from hetplan.contracts.model_profile import ModelProfile

__all__ = ["OPTIMIZER_STEP_BYTES", "CostModel", "hierarchical_allreduce_time", "ring_allreduce_time"]

#: Bytes of memory traffic per parameter for one optimizer step in fp32 (read and write):
#: SGD reads w, g and writes w (12); momentum adds the buffer read+write (20); Adam reads w, g, m, v
#: and writes w, m, v (28). The step is memory-bound, so its time is traffic / memory bandwidth.
OPTIMIZER_STEP_BYTES = {"sgd": 12.0, "momentum": 20.0, "adam": 28.0, "adamw": 28.0}


def ring_allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks whose every hop is ``link``: reduce-scatter then
    all-gather, 2(n-1) steps, each moving one ``nbytes / n`` chunk over every hop at once
    (Patarasuk & Yuan 2009; the alpha-beta model): 2(n-1) (latency + nbytes / (n bandwidth))."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2.0 * (n - 1) / n * nbytes / link.bandwidth + 2.0 * (n - 1) * link.latency


def hierarchical_allreduce_time(nbytes: float, nodes: int, per_node: int, intra: Link, inter: Link) -> float:
    """Reduce-scatter inside each node, all-reduce of the 1/k shards between nodes (the k shards
    share the node's network link, so together they move the whole buffer), all-gather inside:
    ``ring(nbytes, k, intra) + ring(nbytes, nodes, inter)``."""
    if nodes <= 1 or per_node <= 1:
        return float("inf")
    return ring_allreduce_time(nbytes, per_node, intra) + ring_allreduce_time(nbytes, nodes, inter)


@dataclass
class CostModel:
    """Seconds for every action of a compiled plan, from a profile and a cluster."""

    profile: ModelProfile
    cluster: Cluster
    optimizer: str = "adam"
    _fwd: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._block = lru_cache(maxsize=None)(self._block_times)

    def _block_times(self, type_name: str, samples: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        device_type = self.cluster.catalog.get(type_name)
        pairs = [self.profile.block_time(i, device_type, samples) for i in range(len(self.profile.blocks))]
        return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)

    def block_times(self, device: Device, samples: int, *, backward: bool) -> tuple[float, ...]:
        """Per-block seconds on ``device`` for ``samples`` samples (forward or backward)."""
        fwd, bwd = self._block(device.type.name, samples)
        return bwd if backward else fwd

    def compute(self, device: Device, start: int, end: int, samples: int, *, backward: bool) -> float:
        """Forward or backward seconds of blocks ``[start, end)`` on ``device`` for ``samples`` samples."""
        key = (device.type.name, start, end, samples, backward)
        cached = self._fwd.get(key)
        if cached is None:
            cached = sum(self.block_times(device, samples, backward=backward)[start:end])
            self._fwd[key] = cached
        return cached

    def boundary_bytes(self, stage_end: int, samples: int) -> float:
        """Bytes crossing the cut after block ``stage_end - 1`` for ``samples`` samples (each way)."""
        return self.profile.blocks[stage_end - 1].output_bytes * samples

    def gradient_bytes(self, blocks: tuple[int, ...]) -> float:
        """Bytes of gradients of ``blocks`` as the runtime all-reduces them: the parameters' storage
        size in fp32, and for fp16/bf16 plans the fp32 accumulation buffers (4 bytes a parameter:
        gradients of many micro-batches summed and reduced in half precision would lose their bits)."""
        if self.profile.dtype in ("fp16", "bf16"):
            return 4.0 * sum(self.profile.blocks[b].params for b in blocks)
        return sum(self.profile.blocks[b].param_bytes for b in blocks)

    def network_link(self, node_a: str, node_b: str) -> Link:
        """The path between two nodes as one stream sees it: the inter-node link, capped by the
        sender's and the receiver's network interface (``nic``), which the link may exceed."""
        link = self.cluster.inter_node_link(node_a, node_b)
        nic = min(self.cluster.node(node_a).nic_bandwidth, self.cluster.node(node_b).nic_bandwidth)
        if nic < link.bandwidth:
            return Link(bandwidth=nic, latency=link.latency, shared=link.shared)
        return link

    def allreduce(self, nbytes: float, devices: list[Device]) -> float:
        """All-reduce time for ``devices``: the faster of a flat ring and, where every node holds
        the same number (>1) of them, a hierarchical all-reduce.

        The flat ring visits the devices node by node, so it crosses each node's own link (if the
        node holds more than one of them) and one network path between consecutive nodes; each
        of its steps lasts as long as its slowest hop, so its time is the largest
        :func:`ring_allreduce_time` over the links it crosses.

        The result is divided by the cluster's ``collective_efficiency`` (default 1.0): what a real
        collective library achieves relative to the alpha-beta model, fitted by ``hetplan calibrate``."""
        return self._allreduce(nbytes, devices) / self.cluster.collective_efficiency

    def _allreduce(self, nbytes: float, devices: list[Device]) -> float:
        """The alpha-beta model's all-reduce time (see :meth:`allreduce`)."""
        n = len(devices)
        if n <= 1 or nbytes <= 0:
            return 0.0
        by_node: dict[str, list[Device]] = {}
        for d in devices:
            by_node.setdefault(d.node, []).append(d)
        nodes = list(by_node)
        intra = [self.cluster.node(x).link for x in nodes if len(by_node[x]) > 1]
        inter = []
        if len(nodes) > 1:
            inter = [self.network_link(nodes[i], nodes[(i + 1) % len(nodes)]) for i in range(len(nodes))]
        flat = max(ring_allreduce_time(nbytes, n, link) for link in intra + inter)
        counts = {len(v) for v in by_node.values()}
        if len(nodes) > 1 and len(counts) == 1 and next(iter(counts)) > 1:
            k = next(iter(counts))
            inside = max(ring_allreduce_time(nbytes, k, link) for link in intra)
            between = max(ring_allreduce_time(nbytes, len(nodes), link) for link in inter)
            return min(flat, inside + between)
        return flat

    def optimizer_step(self, device: Device, start: int, end: int) -> float:
        """Seconds of the optimizer step for the parameters of blocks ``[start, end)``."""
        params = sum(b.params for b in self.profile.blocks[start:end])
        return params * OPTIMIZER_STEP_BYTES[self.optimizer] / device.type.memory_bandwidth

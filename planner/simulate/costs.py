"""The cost model's terms, each named after what it models (see docs/cost-model.md).

costs = CostModel(profile, cluster, optimizer="adam")
costs.compute(device, start=0, end=9, samples=4, backward=False)   # seconds
costs.compute(device, 0, 9, 4, backward=True, tp=2, recompute="selective")  # one TP member's B
costs.allreduce(group_bytes, devices)                               # seconds
costs.reduce_scatter(group_bytes, devices)                          # ZeRO-1: half an all-reduce

Tensor parallelism (Shoeybi et al. 2019): a member of a degree-``t`` group computes each block at
the profile's degree-``t`` time (compute only) plus the block's all-reduce, ``allreduce_bytes`` x
samples in a ring of ``t`` devices over its node's own link, once in the forward and once in the
backward, not overlapped with compute (Megatron without sequence-parallel overlap). Recomputation:
``full`` re-runs each block's forward (its compute and its all-reduce) right before the block's
backward; ``selective`` re-runs the attention core (the profile's ``recompute`` time).

Overheads (docs/cost-model.md, "Overheads"): every forward and backward call of a stage adds its
device type's ``micro_batch_s`` (a full recomputation's re-run forward adds it once more); per-kernel
launch costs are in the profile's block times (the catalog's ``efficiency.launch``).
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from functools import lru_cache
from typing import NamedTuple

from hetplan.contracts.catalog import DeviceType
from hetplan.contracts.cluster import Cluster, Device, Link
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import RECOMPUTE
from hetplan.errors import HetplanError

__all__ = [
    "OPTIMIZER_STEP_BYTES",
    "CostModel",
    "ProfileSnapshot",
    "block_costs",
    "hierarchical_allreduce_time",
    "ring_allreduce_time",
    "shared_cost_model",
    "tp_allreduce_time",
]

#: Bytes of memory traffic per parameter for one optimizer step in fp32 (read and write):
#: SGD reads w, g and writes w (12); momentum adds the buffer read+write (20); Adam reads w, g, m, v
#: and writes w, m, v (28). The step is memory-bound, so its time is traffic / memory bandwidth.
OPTIMIZER_STEP_BYTES = {"sgd": 12.0, "momentum": 20.0, "adam": 28.0, "adamw": 28.0}


def ring_allreduce_time(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks on ``link``: :meth:`Link.ring_allreduce_time`
    (one formula, shared with the runtime's link emulation)."""
    return link.ring_allreduce_time(nbytes, n)


def hierarchical_allreduce_time(nbytes: float, nodes: int, per_node: int, intra: Link, inter: Link) -> float:
    """Reduce-scatter inside each node, all-reduce of the 1/k shards between nodes (the k shards
    share the node's network link, so together they move the whole buffer), all-gather inside:
    ``ring(nbytes, k, intra) + ring(nbytes, nodes, inter)``."""
    if nodes <= 1 or per_node <= 1:
        return float("inf")
    return ring_allreduce_time(nbytes, per_node, intra) + ring_allreduce_time(nbytes, nodes, inter)


def tp_allreduce_time(nbytes: float, tp: int, link: Link, collective_efficiency: float = 1.0) -> float:
    """One Megatron all-reduce of ``nbytes`` inside a tensor-parallel group of ``tp`` devices on
    one node: a ring over the node's link, divided by the cluster's collective efficiency."""
    return ring_allreduce_time(nbytes, tp, link) / collective_efficiency


def block_costs(
    profile: ModelProfile,
    device_type: DeviceType,
    samples: float,
    *,
    tp: int = 1,
    recompute: str = "none",
    link: Link | None = None,
    collective_efficiency: float = 1.0,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-block (forward, backward) seconds of one member of a degree-``tp`` replica running
    ``samples`` samples: compute at the degree, the blocks' all-reduces over ``link`` (the node's
    own link; required for ``tp`` >= 2), and what ``recompute`` adds to each backward. The one
    formula the simulator and the search's tables share. Blocks without the degree (or without
    times for the type at it) are NaN."""
    if recompute not in RECOMPUTE:
        raise HetplanError(f"unknown recompute {recompute!r}; expected one of {', '.join(RECOMPUTE)}")
    if tp > 1 and link is None:
        raise HetplanError(f"a tensor-parallel degree {tp} needs the link its group all-reduces over")
    fwd: list[float] = []
    bwd: list[float] = []
    for i in range(len(profile.blocks)):
        # a block without the degree, or without times for this type at it, is NaN: the search
        # leaves ranges holding it out (partition.has_degree); the simulator's check refuses it
        if tp > 1 and (tp not in profile.blocks[i].tensor_parallel or tp not in profile.tp_degrees(i, device_type)):
            fwd.append(math.nan)
            bwd.append(math.nan)
            continue
        f, b = profile.block_time(i, device_type, samples, tp)
        if tp > 1:
            shard = profile.blocks[i].shard(tp)
            if not shard.allreduce_in_time:
                assert link is not None
                ar = tp_allreduce_time(shard.allreduce_bytes * samples, tp, link, collective_efficiency)
                f += ar
                b += ar
        if recompute == "full":
            b += f
        elif recompute == "selective":
            b += profile.recompute_time(i, device_type, samples, tp)
        fwd.append(f)
        bwd.append(b)
    return tuple(fwd), tuple(bwd)


@dataclass
class CostModel:
    """Seconds for every action of a compiled plan, from a profile and a cluster."""

    profile: ModelProfile
    cluster: Cluster
    optimizer: str = "adam"
    _fwd: dict = field(default_factory=dict, repr=False)
    _paths: dict = field(default_factory=dict, repr=False)
    _rings: dict = field(default_factory=dict, repr=False)
    _step_params: dict = field(default_factory=dict, init=False, repr=False)  # (start, end, tp, divisor)

    def __post_init__(self) -> None:
        self._block = lru_cache(maxsize=None)(self._block_times)

    def _block_times(
        self, type_name: str, samples: int, tp: int = 1, recompute: str = "none", link: Link | None = None
    ) -> tuple[tuple[float, ...], tuple[float, ...]]:
        device_type = self.cluster.catalog.get(type_name)
        if tp == 1 and recompute == "none":
            pairs = [self.profile.block_time(i, device_type, samples) for i in range(len(self.profile.blocks))]
            return tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
        return block_costs(
            self.profile,
            device_type,
            samples,
            tp=tp,
            recompute=recompute,
            link=link,
            collective_efficiency=self.cluster.collective_efficiency,
        )

    def block_times(
        self, device: Device, samples: int, *, backward: bool, tp: int = 1, recompute: str = "none"
    ) -> tuple[float, ...]:
        """Per-block seconds on ``device`` for ``samples`` samples (forward or backward); at ``tp``
        >= 2 with the blocks' all-reduces on the device's node, and what ``recompute`` adds."""
        # keyed by the node's link, not the node: the times depend on nothing else of it, and a
        # 512-device plan's TP groups sit on dozens of nodes with one kind of link
        link = self.cluster.node(device.node).link if tp > 1 else None
        fwd, bwd = self._block(device.type.name, samples, tp, recompute, link)
        return bwd if backward else fwd

    def compute(
        self,
        device: Device,
        start: int,
        end: int,
        samples: int,
        *,
        backward: bool,
        tp: int = 1,
        recompute: str = "none",
    ) -> float:
        """Forward or backward seconds of blocks ``[start, end)`` on ``device`` for ``samples``
        samples, as a member of a degree-``tp`` group with ``recompute`` (see the module docstring),
        plus the type's fixed cost of one call (``micro_batch_s``: independent of the samples, so
        small micro-batches pay it most)."""
        key = (device.type.name, device.node if tp > 1 else "", start, end, samples, backward, tp, recompute)
        cached = self._fwd.get(key)
        if cached is None:
            per_block = self.block_times(device, samples, backward=backward, tp=tp, recompute=recompute)
            cached = sum(per_block[start:end]) + device.type.micro_batch_s
            if recompute == "full" and backward:  # the re-run forward is a call of its own
                cached += device.type.micro_batch_s
            self._fwd[key] = cached
        return cached

    def boundary_bytes(self, stage_end: int, samples: int) -> float:
        """Bytes crossing the cut after block ``stage_end - 1`` for ``samples`` samples (each way)."""
        return self.profile.blocks[stage_end - 1].output_bytes * samples

    def gradient_bytes(self, blocks: tuple[int, ...], tp: int = 1) -> float:
        """Bytes of gradients of ``blocks`` as the runtime all-reduces them: the parameters' storage
        size in fp32, and for fp16/bf16 plans the fp32 accumulation buffers (4 bytes a parameter:
        gradients of many micro-batches summed and reduced in half precision would lose their bits).
        At ``tp`` >= 2, one shard's: each device's parameters at that degree."""
        shards = [self.profile.blocks[b].shard(tp) for b in blocks]
        if self.profile.dtype in ("fp16", "bf16"):
            return 4.0 * sum(s.params for s in shards)
        return sum(s.param_bytes for s in shards)

    def shared_gradient_bytes(self, index: int, tp: int = 1) -> float:
        """Bytes of the gradient of the profile's shared entry ``index`` as its holders all-reduce
        it (one member's at degree ``tp``), by the rule of :meth:`gradient_bytes`."""
        params, param_bytes = self.profile.shared[index].at(tp)
        return 4.0 * params if self.profile.dtype in ("fp16", "bf16") else param_bytes

    def network_link(self, node_a: str, node_b: str) -> Link:
        """The path between two nodes as one stream sees it: the inter-node link, capped by the
        sender's and the receiver's network interface (``nic``), which the link may exceed.
        Cached per pair (a ring over many nodes asks for each pair again and again)."""
        key = (node_a, node_b)
        found = self._paths.get(key)
        if found is None:
            link = self.cluster.inter_node_link(node_a, node_b)
            nic = min(self.cluster.node(node_a).nic_bandwidth, self.cluster.node(node_b).nic_bandwidth)
            found = Link(bandwidth=nic, latency=link.latency, shared=link.shared) if nic < link.bandwidth else link
            self._paths[key] = found
        return found

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

    def allreduce_over_nodes(self, nbytes: float, counts: dict[str, int]) -> float:
        """:meth:`allreduce` of devices given as how many each node holds, nodes in ring order
        (the order the devices first appear): all the ring model needs to know of them."""
        return self._ring_model(nbytes, counts) / self.cluster.collective_efficiency

    def _allreduce(self, nbytes: float, devices: list[Device]) -> float:
        """The alpha-beta model's all-reduce time (see :meth:`allreduce`)."""
        if len(devices) <= 1 or nbytes <= 0:
            return 0.0
        counts: dict[str, int] = {}
        for d in devices:
            counts[d.node] = counts.get(d.node, 0) + 1
        return self._ring_model(nbytes, counts)

    def _ring_model(self, nbytes: float, counts: dict[str, int]) -> float:
        """The alpha-beta all-reduce of devices counted per node. A ring's time on a link depends
        on its bandwidth and latency alone, so each distinct pair is priced once (the same
        maximum as over every hop)."""
        n = sum(counts.values())
        if n <= 1 or nbytes <= 0:
            return 0.0
        nodes = tuple(counts)
        intra = self._ring_links(tuple(x for x in nodes if counts[x] > 1), ring=False)
        inter = self._ring_links(nodes, ring=True) if len(nodes) > 1 else {}
        flat = max(ring_allreduce_time(nbytes, n, link) for link in [*intra.values(), *inter.values()])
        sizes = set(counts.values())
        if len(nodes) > 1 and len(sizes) == 1 and next(iter(sizes)) > 1:
            k = next(iter(sizes))
            inside = max(ring_allreduce_time(nbytes, k, link) for link in intra.values())
            between = max(ring_allreduce_time(nbytes, len(nodes), link) for link in inter.values())
            flat = min(flat, inside + between)
        return flat + self._staging_copies(nbytes, nodes)

    def _staging_copies(self, nbytes: float, nodes: tuple[str, ...]) -> float:
        """A host-staged collective copies its buffer to host memory once and back once (the ring
        itself runs between host buffers, over the links above): the slowest staged node's two copies."""
        copies = [self.cluster.node(x).staging for x in nodes]
        return max((2.0 * c.transfer_time(nbytes) for c in copies if c is not None), default=0.0)

    def _ring_links(self, nodes: tuple[str, ...], *, ring: bool) -> dict[tuple[float, float], Link]:
        """The distinct links (by bandwidth and latency) of ``nodes``' own links, or (``ring``) of
        the network paths between consecutive nodes of a ring through them; cached per node tuple
        (many rings pass the same nodes in the same order)."""
        key = (nodes, ring)
        found = self._rings.get(key)
        if found is None:
            found = {}
            if ring:
                for i in range(len(nodes)):
                    link = self.network_link(nodes[i], nodes[(i + 1) % len(nodes)])
                    found.setdefault((link.bandwidth, link.latency), link)
            else:
                for x in nodes:
                    link = self.cluster.node(x).link
                    found.setdefault((link.bandwidth, link.latency), link)
            self._rings[key] = found
        return found

    def reduce_scatter(self, nbytes: float, devices: list[Device]) -> float:
        """ZeRO-1's reduce-scatter of a group's gradients: the first half of a ring all-reduce,
        ``(n-1)/n · bytes / bandwidth + (n-1) · latency`` on its slowest link (and half of the
        hierarchical variant where that is faster): :meth:`allreduce` / 2."""
        return self.allreduce(nbytes, devices) / 2.0

    def all_gather(self, nbytes: float, devices: list[Device]) -> float:
        """ZeRO-1's all-gather of the updated parameters: the second half of a ring all-reduce of
        the same bytes (:meth:`allreduce` / 2)."""
        return self.allreduce(nbytes, devices) / 2.0

    def optimizer_step(
        self, device: Device, start: int, end: int, *, tp: int = 1, holders: dict[int, int] | None = None
    ) -> float:
        """Seconds of the optimizer step for the parameters of blocks ``[start, end)`` this device
        holds at degree ``tp``; with ZeRO-1, ``holders[b]`` devices share block ``b``'s step."""
        # one divisor for every block (no ZeRO, or a whole stage shared alike): the same sum for
        # every device and plan asking, added once, in the same order
        shared = holders.get(start, 1) if holders else 1
        if not holders or all(holders.get(b, 1) == shared for b in range(start, end)):
            key = (start, end, tp, shared)
            params = self._step_params.get(key)
            if params is None:
                params = 0.0
                for b in range(start, end):
                    params += self.profile.blocks[b].shard(tp).params / shared
                params += self.profile.shared_held(start, end, tp)[0]  # tied copies: stepped whole
                self._step_params[key] = params
            return params * OPTIMIZER_STEP_BYTES[self.optimizer] / device.type.memory_bandwidth
        params = 0.0
        for b in range(start, end):
            share = self.profile.blocks[b].shard(tp).params
            params += share / (holders.get(b, 1) if holders else 1)
        params += self.profile.shared_held(start, end, tp)[0]
        return params * OPTIMIZER_STEP_BYTES[self.optimizer] / device.type.memory_bandwidth


class ProfileSnapshot(NamedTuple):
    """What the cost model and the memory walk read of a profile, by identity: its blocks (each
    kept, so none is freed and its ``id`` reused), input bytes and dtype. A cache made for one
    profile serves it again only while :meth:`holds` (a block replaced in the list, or the list
    replaced, starts the cache afresh). Not seen: a block's ``times`` or ``tensor_parallel`` dict
    changed in place after the profile was first simulated (nothing in hetplan does; build a new
    block instead)."""

    blocks: tuple
    input_bytes: float
    dtype: str
    shared: tuple = ()

    @classmethod
    def of(cls, profile: ModelProfile) -> ProfileSnapshot:
        return cls(tuple(profile.blocks), profile.input_bytes, profile.dtype, tuple(profile.shared))

    def holds(self, profile: ModelProfile) -> bool:
        """Whether ``profile`` still has these blocks (the same objects), input bytes, dtype and
        shared entries (frozen: compared by value)."""
        return (
            len(self.blocks) == len(profile.blocks)
            and all(map(operator.is_, self.blocks, profile.blocks))
            and self.input_bytes == profile.input_bytes
            and self.dtype == profile.dtype
            and self.shared == tuple(profile.shared)
        )


#: The last few cost models :func:`shared_cost_model` made, newest first: (profile, what it held,
#: cluster, its collective efficiency, optimizer, model). A few: a search simulates thousands of
#: plans of one model on one cluster, a test or a what-if a handful of pairs; the entries hold their
#: profiles and clusters alive, and each model's caches (bounded by the block ranges, shares and
#: node sets priced) with them.
_RECENT: list[tuple[ModelProfile, ProfileSnapshot, Cluster, float, str, CostModel]] = []
_RECENT_SIZE = 4


def shared_cost_model(profile: ModelProfile, cluster: Cluster, optimizer: str) -> CostModel:
    """One :class:`CostModel` for a (profile, cluster, optimizer), made once for many simulations.

    Why: a model's caches (each block's seconds at each share and degree, collective paths and
    rings) are the same for every plan of that model on that cluster, and a search's refinement
    simulates thousands of small plans whose pricing from scratch was a third of their time. Its
    figures are the same floats either way (the caches only remember them). A profile or cluster
    is matched by identity; a profile changed where the cost model reads it
    (:class:`ProfileSnapshot`) or a cluster whose ``collective_efficiency`` changed gets a fresh one."""
    for p, snapshot, c, efficiency, o, model in _RECENT:
        if (
            p is profile
            and c is cluster
            and o == optimizer
            and efficiency == cluster.collective_efficiency
            and snapshot.holds(profile)
        ):
            return model
    model = CostModel(profile, cluster, optimizer=optimizer)
    _RECENT.insert(0, (profile, ProfileSnapshot.of(profile), cluster, cluster.collective_efficiency, optimizer, model))
    del _RECENT[_RECENT_SIZE:]
    return model

"""The cluster: nodes of devices, the link inside each node, the network between nodes.

    cluster = load_cluster("profiles/clusters/mixed-a100-v100.yaml")
    a, b = cluster.device("node0/0"), cluster.device("node2/3")
    cluster.link(a, b)            # Link(bandwidth=12.5e9, latency=1e-05, shared=True)

Devices are addressed ``NODE/INDEX``. Between nodes the default ``network`` link applies unless a
``groups`` entry (a rack or zone: a faster link among its nodes) or an ``overrides`` entry (one
pair of nodes) says otherwise; the most specific wins: pair, then group, then default. Inter-node
links are *shared*: concurrent transfers out of (or into) one node split its network bandwidth.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from hetplan.contracts.catalog import (
    Catalog,
    DeviceType,
    load_catalog,
    parse_device_spec,
    parse_emulated,
    parse_overhead,
)
from hetplan.contracts.fields import Fields
from hetplan.contracts.prices import parse_node_price
from hetplan.contracts.yamlio import read_mapping, schema_of
from hetplan.errors import HetplanError

__all__ = ["CLUSTER_SCHEMA", "Cluster", "Device", "Link", "Node", "load_cluster", "parse_cluster"]

CLUSTER_SCHEMA = "hetplan/cluster/v1"

#: The most devices one ``{type, count}`` entry may add. No server holds more; a larger number is a
#: typo, and would otherwise build millions of device objects before anything else is checked.
MAX_DEVICES_PER_ENTRY = 4096

#: ``collective_efficiency`` above this is a typo (a collective 100x faster than its links allow).
MAX_COLLECTIVE_EFFICIENCY = 100.0


@dataclass(frozen=True)
class Link:
    """A point-to-point path: bandwidth in bytes/s, latency in seconds.

    ``shared`` marks a link whose bandwidth is a node's network interface, split between the
    transfers that use it at the same time (the simulator models the contention). ``emulated``
    (``emulate: true`` in the file) asks the runtime to make every transfer and collective on it
    take at least ``latency + bytes / bandwidth``: a slow network emulated on one fast machine.
    """

    bandwidth: float
    latency: float
    shared: bool = False
    emulated: bool = False
    #: a path whose ends copy through host memory (a node's ``host_staged``): its own link class
    staged: bool = False

    def transfer_time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` alone on this link (latency + size / bandwidth)."""
        if nbytes <= 0:
            return 0.0
        return self.latency + nbytes / self.bandwidth

    def ring_allreduce_time(self, nbytes: float, n: int) -> float:
        """Ring all-reduce of ``nbytes`` over ``n`` ranks whose every hop is this link: reduce-scatter
        then all-gather, 2(n-1) steps, each moving one ``nbytes / n`` chunk over every hop at once
        (Patarasuk & Yuan 2009; the alpha-beta model): 2(n-1) (latency + nbytes / (n bandwidth))."""
        if n <= 1 or nbytes <= 0:
            return 0.0
        return 2.0 * (n - 1) / n * nbytes / self.bandwidth + 2.0 * (n - 1) * self.latency


@dataclass(frozen=True)
class Device:
    """One accelerator: its address ``node/index`` and its type."""

    node: str
    index: int
    type: DeviceType

    @property
    def address(self) -> str:
        return f"{self.node}/{self.index}"


@dataclass(frozen=True)
class Node:
    name: str
    devices: tuple[Device, ...]
    link: Link
    nic_bandwidth: float
    #: USD per hour for the whole node as the cluster file states it (``price_per_hour``), overriding
    #: its devices' catalog prices; None: not stated (:meth:`Cluster.node_price` falls back).
    price_per_hour: float | None = None
    #: the host-staged transport (``host_staged: {bandwidth, latency}``): the copy between a device and
    #: host memory that every transfer and collective of this node's devices makes at each end (gloo
    #: carrying GPU tensors, several ranks on one GPU, GPUs that cannot share an NCCL communicator);
    #: None: the devices communicate directly
    staging: Link | None = None


@dataclass(frozen=True)
class _PairLink:
    nodes: frozenset[str]
    link: Link


@dataclass(frozen=True)
class _GroupLink:
    name: str
    nodes: frozenset[str]
    link: Link


class Cluster:
    """Nodes, devices and the links between any two of them."""

    def __init__(
        self,
        *,
        name: str,
        nodes: tuple[Node, ...],
        network: Link,
        groups: tuple[_GroupLink, ...] = (),
        overrides: tuple[_PairLink, ...] = (),
        catalog: Catalog,
        file: str | None = None,
        description: str = "",
        collective_efficiency: float = 1.0,
        calibrated: dict | None = None,
    ) -> None:
        self.name = name
        self.nodes = nodes
        self.network = network
        self.groups = groups
        self.overrides = overrides
        self.catalog = catalog
        self.file = file
        self.description = description
        #: Measured all-reduce speed relative to the alpha-beta ring model (``CostModel.allreduce``
        #: divides the model's time by it): 1.0 is the model as written, 0.8 a collective 25% slower.
        self.collective_efficiency = collective_efficiency
        #: ``hetplan calibrate``'s note of the fit that wrote this file (free-form; empty otherwise).
        self.calibrated = calibrated or {}
        self._devices = {d.address: d for n in nodes for d in n.devices}
        self._node = {n.name: n for n in nodes}

    @cached_property
    def devices(self) -> tuple[Device, ...]:
        """Every device, in file order (node by node, index by index)."""
        return tuple(d for n in self.nodes for d in n.devices)

    @cached_property
    def device_types(self) -> dict[str, DeviceType]:
        """The types present, in first-seen order."""
        types: dict[str, DeviceType] = {}
        for d in self.devices:
            types.setdefault(d.type.name, d.type)
        return types

    @property
    def emulated(self) -> bool:
        return any(t.emulated for t in self.device_types.values())

    def node(self, name: str) -> Node:
        return self._node[name]

    def node_price(self, node: Node | str) -> float | None:
        """USD per hour of one node: its stated ``price_per_hour``, else the sum of its devices'
        catalog prices; None when neither is known for every device."""
        node = self._node[node] if isinstance(node, str) else node
        if node.price_per_hour is not None:
            return node.price_per_hour
        prices = [d.type.price.per_hour if d.type.price is not None else None for d in node.devices]
        return None if None in prices else round(float(sum(prices)), 9)

    @cached_property
    def price_per_hour(self) -> float | None:
        """USD per hour of the whole cluster; None unless every node has a price."""
        prices = [self.node_price(n) for n in self.nodes]
        return None if None in prices else round(float(sum(prices)), 9)

    def device(self, address: str, *, file: str | None = None, field: str | None = None) -> Device:
        """The device at ``node/index``; an unknown address is a located error."""
        try:
            return self._devices[address]
        except KeyError:
            raise HetplanError(
                f"no device {address!r} in cluster {self.name!r} (devices are NODE/INDEX, "
                f"for example {self.devices[0].address!r})",
                file=file,
                field=field,
            ) from None

    def link(self, a: Device | str, b: Device | str) -> Link:
        """The link a transfer from ``a`` to ``b`` crosses."""
        node_a = a.node if isinstance(a, Device) else a.split("/")[0]
        node_b = b.node if isinstance(b, Device) else b.split("/")[0]
        base = self._node[node_a].link if node_a == node_b else self.inter_node_link(node_a, node_b)
        copies = [n.staging for n in (self._node[node_a], self._node[node_b]) if n.staging is not None]
        return staged_link(base, copies) if copies else base

    def inter_node_link(self, node_a: str, node_b: str) -> Link:
        pair = frozenset((node_a, node_b))
        for override in self.overrides:
            if override.nodes == pair:
                return override.link
        groups = [g for g in self.groups if pair <= g.nodes]
        if groups:  # the smallest group holding both nodes: a rack inside a zone wins
            return min(groups, key=lambda g: (len(g.nodes), self.groups.index(g))).link
        return self.network


def staged_link(base: Link, copies: list[Link]) -> Link:
    """``base`` with a copy through host memory at each staged end (device to host at the sender,
    host to device at the receiver), one after another: the bandwidths add as resistances in series
    (1 / b = 1 / b_link + sum 1 / b_copy), the latencies add."""
    return Link(
        bandwidth=1.0 / (1.0 / base.bandwidth + sum(1.0 / c.bandwidth for c in copies)),
        latency=base.latency + sum(c.latency for c in copies),
        shared=base.shared,
        emulated=base.emulated,
        staged=True,
    )


def _parse_link(f: Fields, *, shared: bool) -> Link:
    emulated = f.raw("emulate", False)
    if not isinstance(emulated, bool):
        raise f.error(f"expected true or false, got {emulated!r}", "emulate")
    return Link(bandwidth=f.bandwidth("bandwidth"), latency=f.time("latency", 0.0), shared=shared, emulated=emulated)


def _parse_device_type(entry: Fields, catalog: Catalog, inline: dict[str, DeviceType]) -> DeviceType:
    type_name = entry.str("type")
    spec = entry.child("spec", None)
    emulate = entry.child("emulate", None)
    if spec is not None and emulate is not None:
        raise entry.error("give either 'spec' or 'emulate', not both", "emulate")
    if spec is None and emulate is None:
        if type_name in inline:
            return inline[type_name]
        return catalog.get(type_name, file=entry.file, field=entry.where("type"))
    if type_name in catalog:
        raise entry.error(f"{type_name!r} is a catalog type; an inline or emulated type needs its own name", "type")
    known = catalog.with_types(inline)
    device = parse_device_spec(type_name, spec) if spec is not None else parse_emulated(type_name, emulate, known)
    for alias in device.aliases:
        if alias in known:
            raise entry.error(f"alias {alias!r} already names a device type", "spec.aliases")
    if type_name in inline and inline[type_name] != device:
        raise entry.error(f"type {type_name!r} is defined twice with different specs", "type")
    inline[type_name] = device
    return device


def parse_cluster(data: dict, *, file: str | None = None, catalog: Catalog | None = None) -> Cluster:
    """Build a :class:`Cluster` from a parsed mapping, checking every field."""
    catalog = catalog or load_catalog()
    f = Fields(data, file=file)
    schema = f.str("schema")
    if schema != CLUSTER_SCHEMA:
        raise f.error(f"expected schema {CLUSTER_SCHEMA}, got {schema!r}", "schema")
    name = f.str("name")
    description = f.str("description", "")
    network_f = f.child("network")
    network = _parse_link(network_f, shared=True)
    inline: dict[str, DeviceType] = {}
    nodes: list[Node] = []
    seen_nodes: set[str] = set()
    for node_f in f.list("nodes"):
        if not isinstance(node_f, Fields):
            raise f.error("expected each node to be a mapping with name, devices and link", "nodes")
        node_name = node_f.str("name")
        if "/" in node_name:
            raise node_f.error("node names may not contain '/' (devices are addressed NODE/INDEX)", "name")
        if node_name in seen_nodes:
            raise node_f.error(f"duplicate node name {node_name!r}", "name")
        seen_nodes.add(node_name)
        devices: list[Device] = []
        for entry in node_f.list("devices"):
            if not isinstance(entry, Fields):
                raise node_f.error("expected each entry to be a mapping such as {type: A100-80GB, count: 8}", "devices")
            device_type = _parse_device_type(entry, catalog, inline)
            count = entry.integer("count", 1, minimum=1, maximum=MAX_DEVICES_PER_ENTRY)
            entry.done()
            for _ in range(count):
                devices.append(Device(node=node_name, index=len(devices), type=device_type))
        link_f = node_f.child("link", None)
        link = _parse_link(link_f, shared=False) if link_f is not None else None
        if link_f is not None:
            link_f.done()
        if link is None:
            if len(devices) > 1:
                raise node_f.error("missing required field (the link inside a node of several devices)", "link")
            link = Link(bandwidth=network.bandwidth, latency=network.latency, emulated=network.emulated)
        nic = node_f.bandwidth("nic", network.bandwidth)
        price = parse_node_price(node_f)
        staged_f = node_f.child("host_staged", None)
        staging = None
        if staged_f is not None:
            staging = Link(bandwidth=staged_f.bandwidth("bandwidth"), latency=staged_f.time("latency", 0.0))
            staged_f.done()
        node_f.done()
        nodes.append(
            Node(
                name=node_name,
                devices=tuple(devices),
                link=link,
                nic_bandwidth=nic,
                price_per_hour=price,
                staging=staging,
            )
        )

    def node_set(entry: Fields, key: str, minimum: int) -> frozenset[str]:
        names = entry.list(key)
        for i, n in enumerate(names):
            if not isinstance(n, str):
                raise entry.error(f"expected a node name, got {n!r}", f"{key}[{i}]")
            if n not in seen_nodes:
                raise entry.error(f"unknown node {n!r}", f"{key}[{i}]")
        if len(set(names)) < minimum:
            raise entry.error(f"expected at least {minimum} distinct nodes", key)
        return frozenset(names)

    groups: list[_GroupLink] = []
    for g in network_f.list("groups", [], non_empty=False):
        if not isinstance(g, Fields):
            raise network_f.error("expected a mapping {name, nodes, bandwidth, latency}", "groups")
        groups.append(_GroupLink(name=g.str("name"), nodes=node_set(g, "nodes", 2), link=_parse_link(g, shared=True)))
        g.done()
    overrides: list[_PairLink] = []
    for o in network_f.list("overrides", [], non_empty=False):
        if not isinstance(o, Fields):
            raise network_f.error("expected a mapping {between: [a, b], bandwidth, latency}", "overrides")
        pair = node_set(o, "between", 2)
        if len(o.raw("between")) != 2:
            raise o.error("expected exactly two node names", "between")
        overrides.append(_PairLink(nodes=pair, link=_parse_link(o, shared=True)))
        o.done()
    network_f.done()
    nodes, inline = _apply_reserves(f, nodes, inline)
    nodes, inline = _apply_overheads(f, nodes, inline)
    collective_efficiency = f.number("collective_efficiency", 1.0, positive=True, maximum=MAX_COLLECTIVE_EFFICIENCY)
    calibrated = f.raw("calibrated", {})
    if not isinstance(calibrated, dict):
        raise f.error("expected a mapping (the note 'hetplan calibrate' writes)", "calibrated")
    f.done()
    return Cluster(
        name=name,
        nodes=tuple(nodes),
        network=network,
        groups=tuple(groups),
        overrides=tuple(overrides),
        catalog=catalog.with_types(inline),
        file=file,
        description=description,
        collective_efficiency=collective_efficiency,
        calibrated=calibrated,
    )


def with_device_types(nodes: Iterable[Node], replaced: Mapping[str, DeviceType]) -> list[Node]:
    """``nodes`` with every device of a type named in ``replaced`` given that type (a per-type figure
    measured on this cluster: a reserve, an overhead, a calibrated value)."""
    return [
        replace(n, devices=tuple(replace(d, type=replaced.get(d.type.name, d.type)) for d in n.devices)) for n in nodes
    ]


def _apply_reserves(
    f: Fields, nodes: list[Node], inline: dict[str, DeviceType]
) -> tuple[list[Node], dict[str, DeviceType]]:
    """``reserve: {TYPE: 2GiB}``: a per-type memory reserve measured on this cluster (``hetplan
    calibrate`` writes it) replaces the catalog's for every device of that type."""
    given = f.mapping_items("reserve", [])
    if not given:
        return nodes, inline
    present = {d.type.name: d.type for n in nodes for d in n.devices}
    replaced: dict[str, DeviceType] = {}
    for name, _ in given:
        if name not in present:
            raise f.error(
                f"no device of type {name!r} in this cluster (types: {', '.join(present)})", f"reserve.{name}"
            )
        device_type = present[name]
        reserve = f.sub("reserve", f.raw("reserve")).bytes(name, positive=False)
        if reserve >= device_type.memory:
            raise f.error(
                f"expected a reserve below the type's memory ({device_type.memory:.0f} bytes)", f"reserve.{name}"
            )
        replaced[name] = replace(device_type, reserve=reserve)
    return with_device_types(nodes, replaced), {**inline, **replaced}


def _apply_overheads(
    f: Fields, nodes: list[Node], inline: dict[str, DeviceType]
) -> tuple[list[Node], dict[str, DeviceType]]:
    """``overheads: {TYPE: {micro_batch: 40us, overlap_slowdown: 1.2}}``: a device type's fixed cost per
    forward or backward call and its compute slowdown under overlapping collectives, as measured on
    this cluster (``hetplan calibrate`` writes them), in place of the catalog's for every device of
    that type. Each figure is optional; one left out keeps the catalog's."""
    given = f.mapping_items("overheads", [])
    if not given:
        return nodes, inline
    present = {d.type.name: d.type for n in nodes for d in n.devices}
    table = f.sub("overheads", f.raw("overheads"))
    replaced: dict[str, DeviceType] = {}
    for name, value in given:
        if name not in present:
            raise f.error(
                f"no device of type {name!r} in this cluster (types: {', '.join(present)})", f"overheads.{name}"
            )
        if not isinstance(value, dict):
            raise table.error("expected a mapping like {micro_batch: 40us, overlap_slowdown: 1.2}", name)
        device_type = present[name]
        entry = table.sub(name, value)
        micro, slowdown = parse_overhead(entry)
        replaced[name] = replace(
            device_type,
            micro_batch_s=micro if "micro_batch" in value else device_type.micro_batch_s,
            overlap_slowdown=slowdown if "overlap_slowdown" in value else device_type.overlap_slowdown,
        )
    return with_device_types(nodes, replaced), {**inline, **replaced}


def load_cluster(path: str | Path, *, catalog: Catalog | None = None) -> Cluster:
    """Load and validate a cluster file."""
    data = read_mapping(path)
    schema_of(data, path)
    return parse_cluster(data, file=str(path), catalog=catalog)

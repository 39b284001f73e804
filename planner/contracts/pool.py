"""A pool: nodes one may add to a cluster (rent, buy, borrow), each with how many are available.

    pool = load_pool("pool.yaml")
    pool.nodes[0].name, pool.nodes[0].count    # "a100", 16
    pool.nodes[0].data                          # the node as a cluster file writes it (no count)

The file is cluster-like (``docs/contracts/pool.md``)::

    schema: hetplan/pool/v1
    nodes:
      - {name: a100, count: 16, devices: [{type: A100-40GB, count: 8}], link: {bandwidth: 600GB/s}}
      - {name: t4, count: 4, devices: [{type: T4, count: 4}], link: {bandwidth: 50Gbps}, price_per_hour: 3.9}

Every node entry is checked exactly as a cluster file's node (it is parsed as one), so a pool node
may carry a ``price_per_hour`` that overrides its devices' catalog prices. Added nodes join the
cluster's default ``network``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import Catalog
from hetplan.contracts.cluster import MAX_DEVICES_PER_ENTRY, Node, parse_cluster
from hetplan.contracts.fields import Fields
from hetplan.contracts.yamlio import read_mapping, schema_of

__all__ = ["POOL_SCHEMA", "Pool", "PoolNode", "load_pool", "parse_pool"]

POOL_SCHEMA = "hetplan/pool/v1"

#: The most nodes of one kind a pool may offer (a larger number is a typo).
MAX_POOL_COUNT = MAX_DEVICES_PER_ENTRY


@dataclass(frozen=True)
class PoolNode:
    """One kind of node on offer: ``count`` identical copies of ``node`` may be added."""

    name: str
    count: int
    node: Node
    #: USD per hour of one node (stated, or its devices' catalog prices); None when unknown.
    price_per_hour: float | None
    #: The node as a cluster file writes it, without ``count``: copied into candidate clusters.
    data: dict[str, Any]


@dataclass(frozen=True)
class Pool:
    nodes: tuple[PoolNode, ...]
    file: str | None = None


def parse_pool(data: dict, *, file: str | None = None, catalog: Catalog | None = None) -> Pool:
    """Check every field: the schema, each node's ``count``, and each node as a cluster node."""
    f = Fields(data, file=file)
    schema = f.str("schema")
    if schema != POOL_SCHEMA:
        raise f.error(f"expected schema {POOL_SCHEMA}, got {schema!r}", "schema")
    entries = f.list("nodes")
    counts: list[int] = []
    plain: list[dict[str, Any]] = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, Fields):
            raise f.error("expected each node to be a mapping with name, count, devices and link", f"nodes[{i}]")
        counts.append(entry.integer("count", minimum=1, maximum=MAX_POOL_COUNT))
        node = copy.deepcopy(data["nodes"][i])
        node.pop("count")
        plain.append(node)
    f.raw("description", None)
    network = f.raw("network", {"bandwidth": "100Gbps"})
    f.done()
    # each node is checked as a cluster node, in the pool's own file and at its own index
    cluster = parse_cluster(
        {"schema": "hetplan/cluster/v1", "name": "pool", "nodes": plain, "network": network},
        file=file,
        catalog=catalog,
    )
    nodes = tuple(
        PoolNode(name=n.name, count=c, node=n, price_per_hour=cluster.node_price(n), data=d)
        for n, c, d in zip(cluster.nodes, counts, plain, strict=True)
    )
    return Pool(nodes=nodes, file=file)


def load_pool(path: str | Path, *, catalog: Catalog | None = None) -> Pool:
    """Load and validate a pool file."""
    data = read_mapping(path)
    schema_of(data, path)
    return parse_pool(data, file=str(path), catalog=catalog)

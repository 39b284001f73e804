"""Turning another planner's layer DAG into hetplan's ordered block list.

    order = topological_order([3, 1, 2], [(1, 2), (1, 3), (2, 3)], file="g.txt")   # [1, 2, 3]
    cut = cut_bytes(order, {(1, 2): 8.0, (1, 3): 8.0, (2, 3): 4.0})                 # [8.0, 12.0, 0.0]

The order is Kahn's algorithm with ties broken by the smallest node id, so it is deterministic and
keeps a chain's file order. ``cut_bytes[i]`` is what must cross a stage boundary placed right after
position ``i``: for every node at or before ``i`` with at least one edge to a node after ``i``, the
largest cost among those crossing edges (one tensor leaves a node once, however many later nodes
read it). An edge that skips positions is therefore counted at every cut it spans. The cut after the
last node is empty (0).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable

from hetplan.errors import HetplanError

__all__ = ["cut_bytes", "topological_order"]


def topological_order(nodes: Iterable[int], edges: Iterable[tuple[int, int]], *, file: str) -> list[int]:
    """Kahn's algorithm, ready nodes taken smallest id first; a cycle is a HetplanError."""
    node_list = list(nodes)
    successors: dict[int, set[int]] = {n: set() for n in node_list}
    indegree: dict[int, int] = dict.fromkeys(node_list, 0)
    for u, v in set(edges):
        successors[u].add(v)
        indegree[v] += 1
    ready = [n for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        n = heapq.heappop(ready)
        order.append(n)
        for v in successors[n]:
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, v)
    if len(order) < len(node_list):
        stuck = sorted(n for n, d in indegree.items() if d > 0)
        shown = ", ".join(str(n) for n in stuck[:8]) + (", ..." if len(stuck) > 8 else "")
        raise HetplanError(
            f"the graph has a cycle (a layer graph must be a DAG); nodes on or after it: {shown}",
            file=file,
            field="edges",
        )
    return order


def cut_bytes(order: list[Hashable], edge_cost: dict[tuple[Hashable, Hashable], float]) -> list[float]:
    """Bytes crossing a cut placed after each position of ``order`` (see the module docstring)."""
    position = {n: i for i, n in enumerate(order)}
    out_edges: dict[Hashable, list[tuple[int, float]]] = {n: [] for n in order}
    for (u, v), cost in edge_cost.items():
        out_edges[u].append((position[v], cost))
    cuts: list[float] = []
    for i in range(len(order)):
        total = 0.0
        for u in order[: i + 1]:
            crossing = [cost for pos, cost in out_edges[u] if pos > i]
            if crossing:
                total += max(crossing)
        cuts.append(total)
    return cuts

"""Device mapping across nodes: which node of one GPU type joins which node of another in a mixed
virtual worker (HetPipe), as an assignment ILP solved with pulp (CBC).

    pairs = pair_nodes(cluster, [a0, a1], [b0, b1, b2])   # [(0, 2), (1, 0)]: index pairs
    # each item is a representative device of a node-slice (a node's devices of one type)

A mixed worker's heavy cut (the boundary between its stages on the two nodes) crosses the link
between them. The ILP picks ``min(|A|, |B|)`` disjoint pairs so that

1. the slowest such link is as fast as possible (heavy cuts stay on fast links: a bottleneck
   assignment, ``max`` linearised through a bound variable), then
2. the links are as fast as possible in total, and
3. ties go to the lower node indices (a tiny weight per pair), so the same inputs give the same plan.

Each node joins at most one worker, so no node's network link carries two workers' cuts: the
pipelines do not contend for an inter-node link. Per-pair ``overrides`` and rack ``groups`` in the
cluster file are what make the choice matter.
"""

from __future__ import annotations

import warnings

from hetplan.contracts.cluster import Cluster, Device
from hetplan.errors import HetplanError

__all__ = ["pair_nodes"]


def pair_nodes(cluster: Cluster, left: list[Device], right: list[Device]) -> list[tuple[int, int]]:
    """Disjoint (left index, right index) pairs, as many as the smaller side has, on the fastest links."""
    count = min(len(left), len(right))
    if count == 0:
        return []
    seconds = {(i, j): 1.0 / cluster.link(a, b).bandwidth for i, a in enumerate(left) for j, b in enumerate(right)}
    if len(set(seconds.values())) == 1:  # every pairing is as good: the index order is optimal
        return [(i, i) for i in range(count)]
    # right-side slices with the same link to every left slice are interchangeable: keep the first
    # `count` of each kind (symmetry), which leaves the optimum unchanged and the ILP small
    kinds: dict[tuple[float, ...], list[int]] = {}
    for j in range(len(right)):
        kinds.setdefault(tuple(seconds[(i, j)] for i in range(len(left))), []).append(j)
    keep = sorted(j for members in kinds.values() for j in members[:count])
    seconds = {(i, j): seconds[(i, j)] for i in range(len(left)) for j in keep}
    with warnings.catch_warnings():  # pulp 3 deprecates the spellings pulp 2.7 needs; pinned < 4
        warnings.simplefilter("ignore", DeprecationWarning)
        return _solve(seconds, left, right, keep, count)


def _solve(
    seconds: dict[tuple[int, int], float], left: list[Device], right: list[Device], keep: list[int], count: int
) -> list[tuple[int, int]]:
    import pulp  # here, not at import: only clusters whose node pairings differ in speed need it

    prob = pulp.LpProblem("pair_nodes", pulp.LpMinimize)
    x = {(i, j): pulp.LpVariable(f"x_{i}_{j}", cat="Binary") for i, j in seconds}
    slowest = pulp.LpVariable("slowest", lowBound=0)
    scale = max(seconds.values())
    cost = {k: seconds[k] / scale for k in x}  # in (0, 1]
    n_pairs = len(x)
    # weights: the bottleneck dominates, then the total, then the index tie-break
    prob += (
        (n_pairs + 1) * 1000 * slowest
        + pulp.lpSum(cost[k] * x[k] for k in x)
        + pulp.lpSum(1e-6 * (i * len(right) + j) / n_pairs * x[(i, j)] for i, j in x)
    )
    for i in range(len(left)):
        prob += pulp.lpSum(x[(i, j)] for j in keep) <= 1
    for j in keep:
        prob += pulp.lpSum(x[(i, j)] for i in range(len(left))) <= 1
    prob += pulp.lpSum(x.values()) == count
    for k in x:
        prob += slowest >= cost[k] * x[k]
    status = prob.solve(pulp.PULP_CBC_CMD(msg=False, threads=1, gapRel=0))  # one thread: deterministic
    if pulp.LpStatus[status] != "Optimal":
        raise HetplanError(f"the node-pairing ILP ended {pulp.LpStatus[status]}", field="plan")
    return sorted(k for k, var in x.items() if var.value() is not None and var.value() > 0.5)

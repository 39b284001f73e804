"""Which devices form each pipeline, in which stage order: the candidate structures of a plan.

    for structure in candidate_structures(cluster, n_blocks=50):
        structure.pipelines      # ((Slot, Slot, ...), ...): stage slots per pipeline, in order

Small clusters (up to ``EXHAUSTIVE_DEVICES`` devices) are enumerated exhaustively: every way to pick
devices and arrange them into ordered pipelines, up to symmetry (two devices of one type on one node
are interchangeable, so only one of their arrangements is kept). Larger clusters get structured
families that cover what heterogeneity-aware planners build:

* per type, pipelines of S stages inside a node or spanning several nodes of that type (Metis,
  Sailor), optionally with stages replicated r ways inside a node (DAPPLE, PipeDream);
* mixed virtual workers that take a node-slice of every type (HetPipe), stage order by memory, the
  slices paired by an assignment ILP (:mod:`hetplan.solve.mapping`) so the cuts between them cross
  the fastest links and no node carries two workers' cuts;
* any subset of device types, so a type that would slow the iteration can be left idle.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from hetplan.contracts.cluster import Cluster, Device
from hetplan.solve.mapping import pair_nodes
from hetplan.solve.partition import Slot

__all__ = [
    "EXHAUSTIVE_DEVICES",
    "Structure",
    "candidate_structures",
    "describe",
    "exhaustive_structures",
    "structured_families",
]

EXHAUSTIVE_DEVICES = 6
EXHAUSTIVE_STRUCTURES = 2000


@dataclass(frozen=True)
class Structure:
    """Pipelines as ordered stage slots; ``label`` says which family produced it. ``parts``: where
    the pipelines are the concatenation of lists that other structures share (one per device type
    in the structured families), those lists, in order (the search caches per list; empty: not
    known). Not part of a structure's identity: two structures with the same pipelines are equal."""

    pipelines: tuple[tuple[Slot, ...], ...]
    label: str
    parts: tuple[tuple[tuple[Slot, ...], ...], ...] = field(default=(), compare=False, repr=False)

    def devices(self) -> list[Device]:
        return [d for p in self.pipelines for s in p for d in s.devices]


def _classes(devices: list[Device]) -> list[list[Device]]:
    """Interchangeable devices: same node, same type (file order kept)."""
    by_key: dict[tuple[str, str], list[Device]] = {}
    for d in devices:
        by_key.setdefault((d.node, d.type.name), []).append(d)
    return list(by_key.values())


def exhaustive_structures(
    cluster: Cluster, *, max_stages: int, max_pipelines: int = 10**9, widths: tuple[int, ...] = (1, 2)
) -> Iterator[Structure]:
    """Every arrangement of a subset of devices into ordered pipelines of stages, one representative
    per symmetry class. A stage is ``w`` devices of one class (one type on one node) for each ``w``
    of ``widths`` the class has room for: replicas, or tensor-parallel groups (the DP chooses)."""
    classes = _classes(list(cluster.devices))
    capacity = [len(c) for c in classes]
    kinds = [(c, w) for c in range(len(classes)) for w in widths if w <= capacity[c]]
    k = len(classes)
    sequences: list[tuple[int, ...]] = []
    for length in range(1, min(max_stages, sum(capacity)) + 1):
        for seq in itertools.product(range(len(kinds)), repeat=length):
            need = [sum(kinds[x][1] for x in seq if kinds[x][0] == c) for c in range(k)]
            if all(need[c] <= capacity[c] for c in range(k)):
                sequences.append(seq)
    needs = [[sum(kinds[x][1] for x in seq if kinds[x][0] == c) for c in range(k)] for seq in sequences]

    def extend(start: int, used: list[int], chosen: list[int]) -> Iterator[list[int]]:
        if chosen:
            yield list(chosen)
        if len(chosen) >= max_pipelines:  # each pipeline needs at least one sample of the batch
            return
        for idx in range(start, len(sequences)):
            need = needs[idx]
            if all(used[c] + need[c] <= capacity[c] for c in range(k)):
                for c in range(k):
                    used[c] += need[c]
                chosen.append(idx)
                yield from extend(idx, used, chosen)  # idx, not idx + 1: a shape may repeat
                chosen.pop()
                for c in range(k):
                    used[c] -= need[c]

    for multiset in extend(0, [0] * k, []):
        taken = [0] * k
        pipelines = []
        for idx in multiset:
            slots = []
            for x in sequences[idx]:
                c, w = kinds[x]
                slots.append(Slot.of(classes[c][taken[c] : taken[c] + w]))
                taken[c] += w
            pipelines.append(tuple(slots))
        yield Structure(tuple(pipelines), describe(pipelines))


def describe(pipelines: list[tuple[Slot, ...]]) -> str:
    """``2 x [A100-80GB > V100-16GB]``: each distinct pipeline shape with how often it occurs."""
    shapes: dict[str, int] = {}
    for p in pipelines:
        shape = " > ".join(_slot_name(s) for s in p)
        shapes[shape] = shapes.get(shape, 0) + 1
    return ", ".join(f"{n} x [{shape}]" for shape, n in shapes.items())


def _slot_name(slot: Slot) -> str:
    """``A100-80GB`` for one device, ``2xA100-80GB`` for a group of one type, else the types joined."""
    names = [d.type.name for d in slot.devices]
    if len(names) > 1 and len(set(names)) == 1:
        return f"{len(names)}x{names[0]}"
    return "+".join(names)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def structured_families(cluster: Cluster, *, max_stages: int) -> Iterator[Structure]:
    """The structured candidates for a large cluster (see the module docstring)."""
    types = list(cluster.device_types)
    by_type: dict[str, list[list[Device]]] = {t: [] for t in types}
    for cls in _classes(list(cluster.devices)):
        by_type[cls[0].type.name].append(cls)

    def type_shapes(type_name: str) -> list[tuple[str, list[tuple[Slot, ...]]]]:
        """Alternative ways to turn all devices of one type into pipelines."""
        classes = by_type[type_name]
        shapes: list[tuple[str, list[tuple[Slot, ...]]]] = []
        sizes = sorted({len(c) for c in classes})
        if len(sizes) == 1:
            per_node = sizes[0]
            # w devices per stage (replicas or tensor-parallel groups: the DP chooses), S stages a node
            for width in _divisors(per_node):
                for stages in _divisors(per_node // width):
                    if stages > max_stages:
                        continue
                    pipes = []
                    for cls in classes:
                        groups = [cls[i : i + width] for i in range(0, len(cls), width)]
                        for p in range(0, len(groups), stages):
                            pipes.append(tuple(Slot.of(g) for g in groups[p : p + stages]))
                    shapes.append((f"{type_name}: {stages} stages x{width}", pipes))
            # pipelines spanning g nodes of this type (for models that do not fit in one node)
            for width in _divisors(per_node):
                span = 2
                while span <= len(classes) and span * per_node // width <= max_stages:
                    pipes = []
                    for g in range(0, len(classes) - span + 1, span):
                        groups = [
                            cls[i : i + width] for cls in classes[g : g + span] for i in range(0, per_node, width)
                        ]
                        pipes.append(tuple(Slot.of(grp) for grp in groups))
                    label = f"{type_name}: {span * per_node // width} stages x{width} over {span} nodes"
                    shapes.append((label, pipes))
                    span *= 2
        else:  # uneven nodes: one pipeline per node, and data parallel
            shapes.append((f"{type_name}: a pipeline per node", [tuple(Slot.of([d]) for d in c) for c in classes]))
            shapes.append((f"{type_name}: data parallel", [(Slot.of([d]),) for c in classes for d in c]))
        return shapes

    # each type's shapes as tuples, made once: every structure that combines one shares the object
    per_type = {t: [(name, tuple(pipes)) for name, pipes in type_shapes(t)] for t in types}
    for subset_size in range(len(types), 0, -1):
        for subset in itertools.combinations(types, subset_size):
            for combo in itertools.product(*(per_type[t] for t in subset)):
                label = "; ".join(name for name, _ in combo)
                if subset_size < len(types):
                    label += f" (idle: {', '.join(t for t in types if t not in subset)})"
                parts = tuple(pipes for _, pipes in combo)
                yield Structure(tuple(p for pipes in parts for p in pipes), label, parts)

    # mixed virtual workers (HetPipe): inside each node, and across one node of each type
    yield from _mixed_workers(cluster, by_type, max_stages=max_stages)


def _mixed_workers(cluster: Cluster, by_type: dict[str, list[list[Device]]], *, max_stages: int) -> Iterator[Structure]:
    mixed_nodes = [n for n in cluster.nodes if len({d.type.name for d in n.devices}) > 1]
    if mixed_nodes:
        pipes = []
        for node in mixed_nodes:
            ordered = sorted(node.devices, key=lambda d: (-d.type.memory, d.index))
            if len(ordered) <= max_stages:
                pipes.append(tuple(Slot.of([d]) for d in ordered))
        others = [n for n in cluster.nodes if n not in mixed_nodes]
        for node in others:
            if len(node.devices) <= max_stages:
                pipes.append(tuple(Slot.of([d]) for d in node.devices))
        if pipes:
            yield Structure(tuple(pipes), "a mixed pipeline per node")
    types = [t for t, classes in by_type.items() if classes]
    if len(types) < 2:
        return
    # one node-slice of each type per worker (types in memory order), as many workers as the scarcest
    # type allows; which slice joins which is an assignment ILP that keeps the cut between consecutive
    # types on the fastest links, one worker per node-slice (planner/solve/mapping.py)
    order = sorted(types, key=lambda t: -cluster.catalog.get(t).memory)
    workers: list[list[list[Device]]] = [[cls] for cls in by_type[order[0]]]
    for t in order[1:]:
        pairs = pair_nodes(cluster, [w[-1][0] for w in workers], [cls[0] for cls in by_type[t]])
        workers = [workers[i] + [by_type[t][j]] for i, j in pairs]
    sizes = {len(cls) for w in workers for cls in w}
    for width in [w for w in (1, 2, 4, 8) if all(size % w == 0 for size in sizes)]:
        pipes = []
        for w in workers:
            groups = [cls[i : i + width] for cls in w for i in range(0, len(cls), width)]
            if len(groups) <= max_stages:
                pipes.append(tuple(Slot.of(g) for g in groups))
        if pipes:
            label = "mixed virtual workers (a node of each type, paired by ILP)"
            yield Structure(tuple(pipes), label + (f", stages x{width}" if width > 1 else ""))


def candidate_structures(
    cluster: Cluster, *, n_blocks: int, max_stages: int = 16, max_pipelines: int = 10**9
) -> Iterator[Structure]:
    """Exhaustive for small clusters, structured families otherwise."""
    limit = min(max_stages, n_blocks)
    if len(cluster.devices) <= EXHAUSTIVE_DEVICES:
        # few devices of many types can still mean thousands of arrangements (6 devices of 6 types:
        # 8463), each simulated: past EXHAUSTIVE_STRUCTURES the structured families take over
        arrangements = exhaustive_structures(cluster, max_stages=limit, max_pipelines=max_pipelines)
        structures = list(itertools.islice(arrangements, EXHAUSTIVE_STRUCTURES + 1))
        if len(structures) <= EXHAUSTIVE_STRUCTURES:
            yield from structures
            return
    yield from structured_families(cluster, max_stages=limit)

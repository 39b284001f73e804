"""Pipelines that run alike, simulated once.

A 512-device plan is mostly copies: 32 pipelines of two or three shapes, each on nodes of its own.
Two pipelines whose every stage holds the same blocks at the same degree, shares and
recomputation, on devices of the same types, node links and staging, sending over the same links
with node interfaces no other pipeline's transfers use, run identically: every task of one starts
and ends when its counterpart in the other does (the same durations, the same float operations, and
nothing in one waits for anything in the other but the gradient groups' collectives, which wait for
every holder and are priced over every holder anyway). The simulator then builds and runs the
tasks of one pipeline of each such class, its *representative*, and copies its figures to the rest.

Pipelines whose transfers do share node interfaces (Megatron's TP 4 on nodes of 8 puts two
pipelines' stages on every node) form a *component*: their flows divide the interfaces among
themselves and nobody else. Two components alike pipeline by pipeline, with the same pipelines on
the same nodes (numbered across the component), run identically by the same argument, so the
unit of folding is the component: the last one of a class runs, and the k-th pipeline of every
other copies the representative's k-th. A pipeline on nodes of its own is a component of one.

What is exact, not approximate (``tests/simulate/test_replicas.py`` holds every field of the folded
result against the full simulation on many plans):

* every time: durations and the link shares of a pipeline's transfers depend only on its own tasks;
  the collectives start at the latest release of their holders, and every holder's counterpart
  releases at the same time;
* the critical path and bottleneck, named as the full simulation names them. The engine takes
  events in (time, order pushed), and a replica's tasks are numbered in pipeline order, so of two
  counterparts the earlier pipeline's is always taken first: a collective is released last by the
  *last* replica of a class, which is why that one represents it, and the full simulation's path,
  which starts at the first task to end last (the first replica's, where a class ends the
  iteration), runs through the first replica until it reaches a collective. :class:`Folding` keeps
  the first replica's names for that stretch.

The folded-away pipelines need no action lists (``compile_plan(..., skip=...)``) and, where every
device's sync buffers follow from its stage alone (``allreduce``, ``topk``), no memory walk of their
own: their devices' memory is their counterparts' (:func:`memory_copies`).

Folded only under the sync modes whose collectives span pipelines alike (``allreduce``, ``adasum``,
``topk``; ZeRO-1 too): ``sdpipe`` reduces inside each pipeline and ``wsp`` prices each device's path
to the central process, so their pipelines are simulated one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.plan import Pipeline, Plan
from hetplan.errors import HetplanError

__all__ = ["Folding", "fold_replicas", "memory_copies", "uncompiled_pipelines"]

#: Sync modes whose pipelines may be folded (above).
FOLDED_SYNC_MODES = ("allreduce", "adasum", "topk")


@dataclass(frozen=True)
class Folding:
    """Which pipelines a simulation runs and whom the others copy.

    ``kept``: the devices whose tasks are built and run (every pipeline not folded away);
    ``copy_of``: a folded-away device -> its counterpart in its class's representative;
    ``pipeline_copy_of``: a folded-away pipeline -> its representative; ``first_of``: a
    representative pipeline -> the first pipeline of its class; ``first_device``: a representative's
    device -> its counterpart in that first pipeline."""

    kept: frozenset[str]
    copy_of: dict[str, str]
    pipeline_copy_of: dict[int, int]
    first_of: dict[int, int]
    first_device: dict[str, str]


def fold_replicas(plan: Plan, cluster: Cluster) -> Folding | None:
    """The classes of ``plan``'s pipelines that run alike; None where no two do (or the sync mode is
    not folded)."""
    if plan.sync not in FOLDED_SYNC_MODES or len(plan.pipelines) < 2:
        return None
    degree: dict[int, int] = {}  # counterparts share gradient groups only where each block has one degree
    for p in plan.pipelines:
        for s in p.stages:
            for b in range(s.start, s.end):
                if degree.setdefault(b, s.tensor_parallel) != s.tensor_parallel:
                    return None
    shapes = [_signature(p, cluster) for p in plan.pipelines]
    copy_of: dict[str, str] = {}
    pipeline_copy_of: dict[int, int] = {}
    first_of: dict[int, int] = {}
    first_device: dict[str, str] = {}
    for components in _classes(plan, cluster, shapes):
        rep, first = components[-1], components[0]
        for k, rep_pi in enumerate(rep):
            rep_devices = plan.pipelines[rep_pi].devices()
            first_of[rep_pi] = first[k]
            first_device.update(zip(rep_devices, plan.pipelines[first[k]].devices(), strict=True))
            for other in components[:-1]:
                pipeline_copy_of[other[k]] = rep_pi
                copy_of.update(zip(plan.pipelines[other[k]].devices(), rep_devices, strict=True))
    if not pipeline_copy_of:
        return None
    kept = frozenset(a for p in plan.pipelines for a in p.devices() if a not in copy_of)
    return Folding(kept, copy_of, pipeline_copy_of, first_of, first_device)


def _classes(plan: Plan, cluster: Cluster, shapes: list[tuple[tuple | None, set[str]]]) -> list[list[tuple[int, ...]]]:
    """The groups of pipelines that run alike, each a list of two or more *components* in pipeline
    order (a component: pipelines whose transfers share node interfaces, transitively; most are one
    pipeline on nodes of its own), the k-th pipeline of each the counterpart of the k-th of the others.

    Two components run alike when their pipelines' signatures are equal with the nodes numbered
    across the component (which pipelines share which node), so a component's tasks interleave on its
    interfaces exactly as its counterpart's do. Where a later component's k-th pipeline would come
    before an earlier one's (the engine takes counterparts in pipeline order, and the last one
    represents the class), the class is left unfolded."""
    owner: dict[str, int] = {}
    parent = list(range(len(plan.pipelines)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for pi, (_, nodes) in enumerate(shapes):
        for n in sorted(nodes):
            if n in owner:
                a, b = root(owner[n]), root(pi)
                parent[max(a, b)] = min(a, b)
            else:
                owner[n] = pi
    components: dict[int, list[int]] = {}
    for pi in range(len(plan.pipelines)):
        components.setdefault(root(pi), []).append(pi)
    classes: dict[tuple, list[tuple[int, ...]]] = {}
    for members in components.values():
        signature = _component_signature(plan, cluster, members, shapes)
        if signature is not None:
            classes.setdefault(signature, []).append(tuple(members))
    out = []
    for group in classes.values():
        ordered = len(group) > 1 and all(a[k] < b[k] for a, b in pairwise(group) for k in range(len(a)))
        if ordered:
            out.append(group)
    return out


def _component_signature(
    plan: Plan, cluster: Cluster, members: list[int], shapes: list[tuple[tuple | None, set[str]]]
) -> tuple | None:
    """The members' signatures in order; for a component of several pipelines, with each device's
    node numbered across the component (None where a member has no signature)."""
    if any(shapes[pi][0] is None for pi in members):
        return None
    if len(members) == 1:
        return (shapes[members[0]][0],)
    numbered: dict[str, int] = {}
    layout = tuple(
        tuple(numbered.setdefault(cluster.device(a).node, len(numbered)) for a in plan.pipelines[pi].devices())
        for pi in members
    )
    return (*(shapes[pi][0] for pi in members), layout)


def memory_copies(plan: Plan, folding: Folding | None) -> dict[str, str]:
    """Devices whose memory is their counterpart's (``folding.copy_of``), where the sync mode's
    buffers do not depend on a device's place among the pipelines (Adasum's tree does)."""
    if folding is None or plan.sync not in ("allreduce", "topk"):
        return {}
    return folding.copy_of


def uncompiled_pipelines(plan: Plan, folding: Folding | None) -> frozenset[int]:
    """The pipelines whose every figure, memory included, is copied (:func:`memory_copies`): their
    action lists are not needed (``compile_plan(..., skip=...)``)."""
    if not memory_copies(plan, folding):
        return frozenset()
    return frozenset(folding.pipeline_copy_of)  # type: ignore[union-attr] (copies imply a folding)


def _signature(pipeline: Pipeline, cluster: Cluster) -> tuple[tuple | None, set[str]]:
    """What a pipeline's simulation depends on, its nodes numbered in order of first use (so that
    pipelines on different nodes compare equal), and the nodes whose interfaces its transfers share.
    A pipeline whose devices are not all in the cluster gets None (the plan check reports it)."""
    numbered: dict[str, int] = {}
    devices = []
    node_of: dict[str, str] = {}
    try:
        for s in pipeline.stages:
            for address in s.devices:
                d = cluster.device(address)
                node = cluster.node(d.node)
                node_of[address] = d.node
                index = numbered.setdefault(d.node, len(numbered))
                devices.append((index, d.type.name, node.link, node.staging, node.nic_bandwidth))
    except HetplanError:  # an unknown device: the plan's own check reports it
        return None, set()
    stages = tuple(
        (s.start, s.end, s.tensor_parallel, s.shares, s.recompute, s.vocab_parallel, len(s.devices))
        for s in pipeline.stages
    )
    links = []
    flows: set[str] = set()
    for before, after in zip(pipeline.stages[:-1], pipeline.stages[1:], strict=True):
        for a in before.devices:
            for b in after.devices:
                there, back = cluster.link(a, b), cluster.link(b, a)
                links.append((there, back))
                if there.shared or back.shared:
                    flows.update((node_of[a], node_of[b]))
    return (pipeline.micro_batches, stages, tuple(devices), tuple(links)), flows

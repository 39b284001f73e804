"""Which parameters each measured run's simulation reads at all.

The fit simulates every run many times, each time with one parameter moved (finite differences).
A run whose simulation does not read that parameter gives the same result, so it need not be
simulated again; on a cluster of many nodes each plan crosses a few link classes, so this is most
of the work saved. It also tells "no measured plan uses it" apart from "used, but the data cannot
tell its value".

What a run reads is found by asking the cluster, not by repeating its rules: a link or collective
parameter matters to a run when moving it changes any figure the simulator takes from the cluster
for that plan (the link of each transfer, the network interface of each node it uses, the links and
the efficiency of each gradient group's all-reduce). A compute parameter matters when the plan
computes on its device type; a per-call overhead (``overhead[TYPE]``) when the run's log gives the
compute time of a rank of the type (iteration times alone cannot separate it from the rest, and a
few of them fit noise with it); an overlap slowdown (``overlap[TYPE]``) when, besides, a device of
the type issues a collective before its last backward ends (it holds a shared gradient group that
stops above its stage's first block).
"""

from __future__ import annotations

import math

from hetplan.calibrate.inputs import Observation
from hetplan.calibrate.params import Model, Param
from hetplan.contracts.cluster import Cluster
from hetplan.schedule.compile import CompiledPlan, with_shared_groups

__all__ = ["relevance"]


def _signature(cluster: Cluster, compiled: CompiledPlan) -> tuple:
    """Every figure of the cluster the simulation of a compiled plan may read: the link of each
    transfer, the network interface of each node with traffic to another node, for each gradient
    group held by several devices the links an all-reduce among them may cross (each node's own
    link where it holds two or more of them, the network path between any two of their nodes) and
    the collective efficiency, and for each tensor-parallel group its node's link and the collective
    efficiency (its all-reduces inside every block). ``compiled`` with the shared parameters' groups
    (:func:`hetplan.schedule.compile.with_shared_groups`): a tied copy's all-reduce reads them too."""
    devices = {a: cluster.device(a) for a in compiled.programs}
    links = [cluster.link(devices[t.src], devices[t.dst]) for t in compiled.transfers]
    networked = {
        devices[a].node
        for t in compiled.transfers
        for a in (t.src, t.dst)
        if devices[t.src].node != devices[t.dst].node
    }
    collective = []
    for g in compiled.groups:
        if len(g.devices) <= 1:
            continue
        per_node: dict[str, int] = {}
        for a in g.devices:
            per_node[devices[a].node] = per_node.get(devices[a].node, 0) + 1
        nodes = sorted(per_node)
        if len(nodes) > 1:
            networked.update(nodes)
        links += [cluster.node(n).link for n in nodes if per_node[n] > 1]
        links += [cluster.inter_node_link(a, b) for k, a in enumerate(nodes) for b in nodes[k + 1 :]]
        collective = [cluster.collective_efficiency]
    # tensor-parallel groups all-reduce inside every block over their node's own link (a group is on
    # one node), at the cluster's collective efficiency: block_costs adds that to each compute
    for node in sorted({devices[a].node for a, prog in compiled.programs.items() if prog.tensor_parallel > 1}):
        links.append(cluster.node(node).link)
        collective = [cluster.collective_efficiency]
    nics = tuple(cluster.node(n).nic_bandwidth for n in sorted(networked))
    return tuple(links), nics, tuple(collective)


def relevance(model: Model, observations: list[Observation]) -> list[set[int]]:
    """For each run, the indices of the parameters its simulation reads."""
    out: list[set[int]] = [set() for _ in observations]
    types = [{model.cluster.device(a).type.name for a in obs.compiled.programs} for obs in observations]
    # per-call overheads and overlap slowdowns are read only through per-rank compute times (run
    # logs): an iteration time alone mixes them with links and bubbles, and a few such runs fit noise
    logged = [{model.cluster.device(a).type.name for a, s in obs.compute_s.items() if s > 0} for obs in observations]
    overlapped = [_overlapping_types(model.cluster, obs) & logged[i] for i, obs in enumerate(observations)]
    compiled = [with_shared_groups(obs.compiled, obs.plan, model.profile.shared) for obs in observations]
    base = [_signature(model.cluster, c) for c in compiled]
    for j, p in enumerate(model.params):
        if p.kind in ("compute", "overhead", "overlap"):
            for i in range(len(observations)):
                seen = {"compute": types, "overhead": logged, "overlap": overlapped}[p.kind][i]
                if p.target[0] in seen:
                    out[i].add(j)
            continue
        moved = _moved(model, p)
        for i, groups in enumerate(compiled):
            if _signature(moved, groups) != base[i]:
                out[i].add(j)
    return out


def _overlapping_types(cluster: Cluster, obs: Observation) -> set[str]:
    """Device types of the plan whose collectives start before their device's last backward ends:
    a device holding a gradient group of several devices that does not reach down to its stage's
    first block (the simulator's overlap, :func:`hetplan.simulate.simulator.overlapped_span`)."""
    programs = obs.compiled.programs
    out: set[str] = set()
    for g in obs.compiled.groups:
        if len(g.devices) <= 1 or g.shared >= 0:  # a tied copy's all-reduce runs after the backward
            continue
        for a in g.devices:
            program = programs[a]
            if min(b for b in g.blocks if program.start <= b < program.end) > program.start:
                out.add(cluster.device(a).type.name)
    return out


def _moved(model: Model, p: Param) -> Cluster:
    """The cluster with ``p`` doubled (a zero latency set to its starting value, then doubled)."""
    _, cluster = model.build({p: p.value(math.log(2.0))})
    return cluster

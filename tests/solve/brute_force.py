"""Exhaustive enumeration of small plans, written independently of the planner.

Space: any subset of devices arranged into pipelines of stages in any order, a stage being one
device or two devices of one type on one node; a two-device stage runs as two replicas (equal
shares) or as one tensor-parallel group of degree 2 (where the profile has degree 2); every
contiguous cut of the blocks for each pipeline; every split of the global batch into positive
pipeline shares; micro-batches of 1 or 2 samples, chosen per pipeline; per stage, recomputation
``none``, ``selective`` or ``full``. Every holder of a block must use one TP degree (the plan
contract), so mixed assignments are skipped. Each plan is scored by the simulator (memory walk,
then the event simulation).

Recomputation is not enumerated blindly: it only adds backward time (a fixed-order schedule never
finishes earlier when a task grows) and only changes its own stage's memory, so each stage takes
the first of ``none, selective, full`` with which its devices fit (the instances' selective
recomputation costs less than a forward). Plans that differ only by swapping two devices of one
type on one node are the same plan (every cost depends only on the type and the node), so one of
them is kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

from hetplan.contracts.cluster import Cluster, Device
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.schedule.compile import compile_plan
from hetplan.simulate import simulate
from hetplan.simulate.memory import plan_memory

ORDER = ("none", "selective", "full")  # fastest first


def unit_sets(devices: list[Device]) -> Iterator[list[tuple[Device, ...]]]:
    """Every set of disjoint stage units over a subset of ``devices``: single devices, and pairs of
    one type on one node."""

    def rec(i: int, taken: frozenset[int]) -> Iterator[list[tuple[Device, ...]]]:
        if i == len(devices):
            yield []
            return
        if i in taken:
            yield from rec(i + 1, taken)
            return
        yield from rec(i + 1, taken)  # device i left idle
        for rest in rec(i + 1, taken):
            yield [(devices[i],), *rest]
        d = devices[i]
        for j in range(i + 1, len(devices)):
            e = devices[j]
            if j not in taken and (e.node, e.type.name) == (d.node, d.type.name):
                for rest in rec(i + 1, taken | {j}):
                    yield [(d, e), *rest]

    yield from rec(0, frozenset())


def arrangements(devices: list[Device]) -> Iterator[list[list[tuple[Device, ...]]]]:
    """Every set of ordered pipelines of stage units, up to symmetry."""
    seen: set = set()
    for units in unit_sets(devices):
        k = len(units)
        if not k:
            continue
        for perm in itertools.permutations(units):
            for mask in range(2 ** (k - 1)):
                pipes, current = [], [perm[0]]
                for i in range(1, k):
                    if mask >> (i - 1) & 1:
                        pipes.append(current)
                        current = [perm[i]]
                    else:
                        current.append(perm[i])
                pipes.append(current)
                key = tuple(sorted(tuple((u[0].node, u[0].type.name, len(u)) for u in p) for p in pipes))
                if key not in seen:
                    seen.add(key)
                    yield pipes


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Ordered splits of ``total`` into ``parts`` positive integers."""
    for bars in itertools.combinations(range(1, total), parts - 1):
        edges = (0, *bars, total)
        yield tuple(edges[i + 1] - edges[i] for i in range(parts))


def cut_choices(n_blocks: int, n_stages: int) -> list[tuple[int, ...]]:
    return [(0, *c, n_blocks) for c in itertools.combinations(range(1, n_blocks), n_stages - 1)]


def _degrees(profile: ModelProfile, pipe: list[tuple[Device, ...]]) -> list[tuple[int, ...]]:
    two = all(2 in b.tensor_parallel for b in profile.blocks)
    return [(1, 2) if len(u) == 2 and two else (1,) for u in pipe]


def _sizes(batch: int) -> tuple[int, ...]:
    return (1, 2) if batch >= 2 else (1,)


def _skeletons(profile: ModelProfile, cluster: Cluster, batch: int) -> Iterator[list[Pipeline]]:
    n = len(profile.blocks)
    for pipes in arrangements(list(cluster.devices)):
        if len(pipes) > batch or any(len(p) > n for p in pipes):
            continue
        per_pipe = []
        for p in pipes:
            choices = []
            for cuts in cut_choices(n, len(p)):
                for tps in itertools.product(*_degrees(profile, p)):
                    stages = tuple(
                        Stage(
                            cuts[i],
                            cuts[i + 1],
                            tuple(d.address for d in u),
                            (1.0,) if t == len(u) else tuple(1.0 / len(u) for _ in u),
                            tensor_parallel=t,
                        )
                        for i, (u, t) in enumerate(zip(p, tps, strict=True))
                    )
                    choices.append(stages)
            per_pipe.append(choices)
        for shares in compositions(batch, len(pipes)):
            for stages in itertools.product(*per_pipe):
                for sizes in itertools.product(*(_sizes(b) for b in shares)):
                    yield [Pipeline(b, _micro(b, m), s) for b, m, s in zip(shares, sizes, stages, strict=True)]


def _micro(batch: int, m: int) -> tuple[int, ...]:
    full, rest = divmod(batch, m)
    return ((rest,) if rest else ()) + (m,) * full


def _one_degree(pipelines: list[Pipeline]) -> bool:
    degree: dict[int, int] = {}
    for p in pipelines:
        for s in p.stages:
            for b in range(s.start, s.end):
                if degree.setdefault(b, s.tensor_parallel) != s.tensor_parallel:
                    return False
    return True


def space_size(profile: ModelProfile, cluster: Cluster, batch: int) -> int:
    """Plans the brute force scores (before recomputation is settled per stage)."""
    return sum(1 for _ in _skeletons(profile, cluster, batch))


def _with_recompute(plan: Plan, profile: ModelProfile, cluster: Cluster) -> Plan | None:
    """Each stage at the first recomputation of ``ORDER`` with which its devices fit, or None."""
    n = len(profile.blocks)
    stages = sum(len(p.stages) for p in plan.pipelines)
    settled: dict[tuple[int, int], str] = {}
    for mode in ORDER:
        if len(settled) == stages:  # every stage fits already: a later mode would settle none
            break
        trial = _recomputed(plan, settled, mode)
        memory = plan_memory(compile_plan(trial, n), profile, cluster, optimizer=plan.optimizer, plan=trial)
        for pi, p in enumerate(trial.pipelines):
            for si, s in enumerate(p.stages):
                if (pi, si) not in settled and all(memory[a].fits for a in s.devices):
                    settled[(pi, si)] = mode
    if len(settled) < stages:
        return None
    return _recomputed(plan, settled, "none")


def _recomputed(plan: Plan, settled: dict[tuple[int, int], str], mode: str) -> Plan:
    pipes = [
        Pipeline(
            p.batch,
            p.micro_batches,
            tuple(replace(s, recompute=settled.get((pi, si), mode)) for si, s in enumerate(p.stages)),
        )
        for pi, p in enumerate(plan.pipelines)
    ]
    return replace(plan, pipelines=pipes)


def best_plan(
    profile: ModelProfile, cluster: Cluster, batch: int, *, optimizer: str = "sgd"
) -> tuple[float, Plan] | None:
    """The fastest plan of the space and its simulated iteration, or None if no plan fits."""
    best: tuple[float, Plan] | None = None
    for pipelines in _skeletons(profile, cluster, batch):
        if not _one_degree(pipelines):
            continue
        plan = _with_recompute(Plan(global_batch=batch, pipelines=pipelines, optimizer=optimizer), profile, cluster)
        if plan is None:
            continue
        result = simulate(plan, profile, cluster)
        if best is None or result.iteration_s < best[0]:
            best = (result.iteration_s, plan)
    return best

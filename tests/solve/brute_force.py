"""Exhaustive enumeration of small plans, written independently of the planner.

Space (the planner's, with one micro-batch size): any subset of devices arranged into pipelines of
single-device stages in any order; every contiguous cut of the blocks for each pipeline; every split
of the global batch into positive pipeline shares; micro-batches of one sample. Each plan is scored
by the simulator. Plans that differ only by swapping two devices of one type on one node are the
same plan (every cost depends only on the type and the node), so one of them is kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from hetplan.contracts.cluster import Cluster, Device
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.simulate import simulate


def arrangements(devices: list[Device]) -> Iterator[list[list[Device]]]:
    """Every set of ordered pipelines over every non-empty subset, up to symmetry."""
    seen: set = set()
    for k in range(1, len(devices) + 1):
        for subset in itertools.combinations(devices, k):
            for perm in itertools.permutations(subset):
                for mask in range(2 ** (k - 1)):
                    pipes, current = [], [perm[0]]
                    for i in range(1, k):
                        if mask >> (i - 1) & 1:
                            pipes.append(current)
                            current = [perm[i]]
                        else:
                            current.append(perm[i])
                    pipes.append(current)
                    key = tuple(sorted(tuple((d.node, d.type.name) for d in p) for p in pipes))
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


def space_size(cluster: Cluster, n_blocks: int, batch: int) -> int:
    total = 0
    for pipes in arrangements(list(cluster.devices)):
        if len(pipes) > batch or any(len(p) > n_blocks for p in pipes):
            continue
        count = len(list(compositions(batch, len(pipes))))
        for p in pipes:
            count *= len(cut_choices(n_blocks, len(p)))
        total += count
    return total


def best_plan(profile: ModelProfile, cluster: Cluster, batch: int, *, optimizer: str = "sgd") -> tuple[float, Plan]:
    n = len(profile.blocks)
    best: tuple[float, Plan] | None = None
    for pipes in arrangements(list(cluster.devices)):
        if len(pipes) > batch or any(len(p) > n for p in pipes):
            continue
        for shares in compositions(batch, len(pipes)):
            for cuts in itertools.product(*(cut_choices(n, len(p)) for p in pipes)):
                pipelines = [
                    Pipeline(b, (1,) * b, tuple(Stage(c[i], c[i + 1], (d.address,), (1.0,)) for i, d in enumerate(p)))
                    for p, c, b in zip(pipes, cuts, shares, strict=True)
                ]
                plan = Plan(global_batch=batch, pipelines=pipelines, optimizer=optimizer)
                result = simulate(plan, profile, cluster)
                if not all(d.memory.fits for d in result.devices.values()):
                    continue
                if best is None or result.iteration_s < best[0]:
                    best = (result.iteration_s, plan)
    assert best is not None
    return best

"""A lower bound on a plan's simulated iteration, without compiling or simulating it.

Why: scoring a large plan by the event simulation costs seconds (a 7B model's plan on 512 devices
has ~236,000 tasks); a caller that wants only the fastest of several plans can simulate them in
the order of this bound and stop once the best simulated time is at most the next bound, with the
same answer as simulating them all.

Why it is a bound (every term is one the simulator also charges, and nothing is ever negative):
a device's computes run one at a time in program order, so its last compute ends at least
``busy`` after its first starts. Its first compute is the forward of some micro-batch ``j``, which
waits for the forwards of ``j`` on every earlier stage (``fill``); its last compute is the backward
of some ``j``, which the backwards of ``j`` on every earlier stage still follow (``drain``), as does
the device's own optimizer step. Transfers, all-reduces and waiting only add to this. The minimum
over micro-batches is taken where a schedule could pick any.
"""

from __future__ import annotations

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.simulate.costs import CostModel

__all__ = ["iteration_lower_bound"]


def iteration_lower_bound(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    costs: CostModel | None = None,
    *,
    members: dict[tuple, tuple] | None = None,
) -> float:
    """Seconds the simulator's iteration of ``plan`` takes at least (see the module docstring).

    Pipelines with a stage split into several data-parallel replicas (more than one share) add
    nothing (how samples split among replicas is the compiler's business); the bound is then
    over the other pipelines only, still a bound.

    ``members``: a dict the caller keeps across plans of one cluster (stage devices -> what the
    bound reads of them); plans laid out alike then look their devices up once, not once per plan.
    """
    members = {} if members is None else members
    costs = costs or CostModel(profile, cluster, optimizer=plan.optimizer)
    # with ZeRO-1 a block's step is shared by at most every device of the plan
    holders = len({a for p in plan.pipelines for s in p.stages for a in s.devices}) if plan.zero else 1
    known: dict[tuple, float] = {}  # pipelines alike (data-parallel copies) are bounded once
    per_pipeline = []
    for p in plan.pipelines:
        key = (p.micro_batches, tuple(_stage_key(s, cluster, members) for s in p.stages))
        if key not in known:
            known[key] = _pipeline_bound(p, costs, cluster, holders, plan.sync)
        per_pipeline.append(known[key])
    if plan.sync == "sdpipe":
        # the simulator's iteration is the global batch over the sum of the pipelines' own rates
        rate = sum(p.batch / t for p, t in zip(plan.pipelines, per_pipeline, strict=True) if t > 0)
        if rate <= 0 or any(t <= 0 for t in per_pipeline):
            return 0.0
        return plan.global_batch / rate
    return max(per_pipeline, default=0.0)


def _stage_key(s: Stage, cluster: Cluster, memo: dict[tuple, tuple]) -> tuple:
    """What a stage's bound depends on: its blocks, settings and shares, and its members' types
    (and their node's link: a TP group all-reduces over it)."""
    grouped = s.tensor_parallel > 1
    members = memo.get((s.devices, grouped))
    if members is None:
        found = set()
        for a in s.devices:
            device = cluster.device(a)
            link = cluster.node(device.node).link
            found.add((device.type.name, link.bandwidth, link.latency) if grouped else device.type.name)
        members = memo[(s.devices, grouped)] = tuple(sorted(found, key=str))
    return (s.start, s.end, s.tensor_parallel, s.recompute, len(s.shares), members)


def _pipeline_bound(p: Pipeline, costs: CostModel, cluster: Cluster, holders: int, sync: str) -> float:
    if any(len(s.shares) != 1 for s in p.stages):
        return 0.0
    sizes = sorted(set(p.micro_batches))
    # per stage and micro-batch size: the fastest member's forward and backward (members of a TP
    # group run the same blocks; taking the fastest keeps the bound a bound)
    fwd: list[dict[int, float]] = []
    bwd: list[dict[int, float]] = []
    busy: list[float] = []
    step: list[float] = []
    for s in p.stages:
        members = [cluster.device(a) for a in dict.fromkeys(s.devices)]

        def fastest(m: int, backward: bool, s=s, members=members) -> float:
            return min(
                costs.compute(d, s.start, s.end, m, backward=backward, tp=s.tensor_parallel, recompute=s.recompute)
                for d in members
            )

        fwd.append({m: fastest(m, False) for m in sizes})
        bwd.append({m: fastest(m, True) for m in sizes})
        busy.append(sum(fwd[-1][m] + bwd[-1][m] for m in p.micro_batches))
        if sync == "wsp":
            step.append(0.0)  # the central process steps; the device only pushes and pulls
        else:
            shared = dict.fromkeys(range(s.start, s.end), holders)
            step.append(
                min(costs.optimizer_step(d, s.start, s.end, tp=s.tensor_parallel, holders=shared) for d in members)
            )
    best = 0.0
    for si in range(len(p.stages)):
        fill = min(sum(fwd[k][m] for k in range(si)) for m in sizes)
        drain = min(sum(bwd[k][m] for k in range(si)) for m in sizes)
        best = max(best, fill + busy[si] + max(drain, step[si]))
    return best

"""The closest uniform structure to a hetplan plan: what every runtime export starts from.

    uniform = uniform_structure(plan, profile, cluster, runtime)
    uniform.stages, uniform.replicas, uniform.micro_batch, uniform.micro_batches, uniform.cuts
    uniform.device(stage, replica)      # rank stage * replicas + replica, as the runtimes number them
    uniform.dropped                     # one line per feature of the plan this structure cannot say

DeepSpeed, Megatron-LM and torchtitan all run one pipeline shape replicated ``D`` times: the same
``S`` stages and layer cuts in every replica, one micro-batch size ``m`` and count ``M`` (so the
global batch is ``D * M * m``), and ranks placed on the grid by number alone: rank ``r`` runs stage
``r // D`` of replica ``r % D`` (DeepSpeed's ``PipeDataParallelTopology`` axes ``[pipe, data]``,
Megatron's default order ``tp-cp-ep-dp-pp``, torchtitan's mesh ``[pp, dp_replicate, ...]``), with
ranks numbered node by node. The choices, in order:

* ``S``: one of the stage counts the plan's pipelines use, capped by what the runtime can cut (a
  Megatron stage needs a whole transformer layer); with several, the one whose structure the
  simulator finds fastest (fitting in memory first), as a user tuning the runtime would pick;
* ``D``: the largest replica count with ``S * D`` at most the plan's devices that divides the global
  batch (the batch stays the plan's: a different batch is a different training run);
* devices: the plan's own; when ``S * D`` is fewer, the slowest (at the plan's micro-batch size)
  are left out. Nodes are ordered by
  where the plan uses their devices (mean relative stage position), and so are the devices inside a
  node where the launcher can order them (torchrun), else by index (DeepSpeed's launcher);
* cuts: the runtime's nearest expressible cut to the plan's own cut of its largest ``S``-stage pipeline;
* ``m``: the plan's most used micro-batch size (by samples), lowered to a divisor of ``G / D``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.simulate import simulate

__all__ = ["RECOMPUTE_FALLBACK", "Cuts", "Runtime", "Uniform", "uniform_structure"]

#: What a recomputation mode becomes where a runtime cannot say it: the next mode that saves at
#: least as much memory.
RECOMPUTE_FALLBACK = {"none": ("none",), "selective": ("selective", "full"), "full": ("full",)}


@dataclass(frozen=True)
class Cuts:
    """A runtime's cut: block boundaries, the settings that produce it, and why it differs."""

    bounds: tuple[int, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    note: str = ""  # what the runtime could not cut as asked (empty when it matches the reference)


@dataclass(frozen=True)
class Runtime:
    """What a runtime can express, and how its files are written (one per module of hetplan.export)."""

    name: str
    title: str
    doc: str  # where its keys are documented
    schedules: tuple[str, ...]  # hetplan schedules it runs
    optimizers: tuple[str, ...]  # hetplan optimizers it runs
    max_stages: Callable[[ModelProfile], int]
    choose_cuts: Callable[[ModelProfile, int, tuple[int, ...]], Cuts]
    render: Callable[..., dict[str, str]]  # (uniform, plan, profile, cluster) -> file name -> text
    notes: Callable[[Plan, ModelProfile], list[str]] = lambda plan, profile: []  # dtype and the like
    #: Whether its launcher can order a node's devices at will (torchrun: CUDA_VISIBLE_DEVICES lists
    #: them in any order); if not, they go by index.
    orders_devices: bool = True
    #: Whether its files can say a tensor-parallel degree (one for the whole model): Megatron-LM's
    #: --tensor-model-parallel-size, torchtitan's tensor_parallel_degree.
    tensor_parallel: bool = False
    #: The recomputation modes it can say (hetplan's ``none``, ``full``, ``selective``); a mode it
    #: cannot say becomes the next in :data:`RECOMPUTE_FALLBACK` it can (selective -> full: more
    #: recomputation, never less memory saved).
    recompute: tuple[str, ...] = ("none",)
    #: Whether it can shard the optimizer state over data-parallel replicas (ZeRO-1: DeepSpeed's
    #: zero_optimization.stage 1, Megatron's --use-distributed-optimizer, torchtitan's FSDP).
    zero: bool = False


@dataclass(frozen=True)
class Uniform:
    """One pipeline shape replicated: what a runtime's configuration expresses."""

    runtime: str
    global_batch: int
    stages: int
    replicas: int
    micro_batch: int
    micro_batches: int
    cuts: tuple[int, ...]
    ranks: tuple[str, ...]  # device addresses; rank r runs stage r // replicas of replica r % replicas
    schedule: str
    optimizer: str
    dtype: str | None
    settings: dict[str, Any]
    dropped: tuple[str, ...]
    tensor_parallel: int = 1  # devices per stage replica; ranks hold each group's devices together
    recompute: str = "none"
    zero: int = 0

    def device(self, stage: int, replica: int) -> str:
        """The first device of the stage's replica (its TP group's rank 0)."""
        return self.ranks[(stage * self.replicas + replica) * self.tensor_parallel]

    def group(self, stage: int, replica: int) -> tuple[str, ...]:
        t = self.tensor_parallel
        first = (stage * self.replicas + replica) * t
        return tuple(self.ranks[first : first + t])

    def nodes(self) -> list[tuple[str, list[int]]]:
        """``(node, device indices)`` in rank order: how the launchers must number the ranks."""
        out: list[tuple[str, list[int]]] = []
        for address in self.ranks:
            node, index = address.split("/")
            if not out or out[-1][0] != node:
                out.append((node, []))
            out[-1][1].append(int(index))
        return out

    def plan(self, original: Plan) -> Plan:
        """The hetplan plan of exactly this structure, on the original's inputs and settings."""
        b = self.global_batch // self.replicas
        pipelines = [
            Pipeline(
                batch=b,
                micro_batches=(self.micro_batch,) * self.micro_batches,
                stages=tuple(
                    Stage(
                        self.cuts[s],
                        self.cuts[s + 1],
                        self.group(s, d),
                        (1.0,),
                        tensor_parallel=self.tensor_parallel,
                        recompute=self.recompute,
                    )
                    for s in range(self.stages)
                ),
            )
            for d in range(self.replicas)
        ]
        return Plan(
            global_batch=self.global_batch,
            pipelines=pipelines,
            schedule=self.schedule,
            dtype=self.dtype,
            optimizer=self.optimizer,
            sync=original.sync,
            zero=self.zero,
            inputs=original.inputs,
        )


def _sizes(micro_batches: tuple[int, ...]) -> str:
    """``1, 2, 4 x 7``: a micro-batch list with runs folded."""
    runs: list[list[int]] = []
    for m in micro_batches:
        if runs and runs[-1][0] == m:
            runs[-1][1] += 1
        else:
            runs.append([m, 1])
    return ", ".join(f"{m} x {k}" if k > 1 else str(m) for m, k in runs)


def _some(items: list[str], limit: int = 3) -> str:
    return "; ".join(items[:limit]) + (f"; and {len(items) - limit} more" if len(items) > limit else "")


def _device_seconds(profile: ModelProfile, cluster: Cluster, address: str, micro_batch: int) -> float:
    """Forward + backward seconds of the whole model on a device at the plan's micro-batch size: its
    slowness where it would run (small batches can rank GPU types the other way round)."""
    device_type = cluster.device(address).type
    return sum(sum(profile.block_time(i, device_type, micro_batch)) for i in range(len(profile.blocks)))


def _reference_cut(plan: Plan, stages: int, n: int) -> tuple[int, ...]:
    """The plan's cut of its largest pipeline with ``stages`` stages (equal block counts if none has)."""
    same = [p for p in plan.pipelines if len(p.stages) == stages]
    if not same:
        return tuple(round(i * n / stages) for i in range(stages + 1))
    p = max(same, key=lambda q: q.batch)  # the first of the largest
    return (*(s.start for s in p.stages), n)


def _rank_order(plan: Plan, cluster: Cluster, kept: set[str], *, orders_devices: bool) -> list[str]:
    """Kept devices node by node: nodes by the mean relative stage position of their devices in the
    plan (early stages first, then file order); devices inside a node by that position too where
    the launcher can order them, else by index."""
    position: dict[str, float] = {}
    for p in plan.pipelines:
        for si, s in enumerate(p.stages):
            for d in s.devices:
                position[d] = (si + 0.5) / len(p.stages)
    nodes = []
    for ni, node in enumerate(cluster.nodes):
        mine = [d.address for d in node.devices if d.address in kept]
        if orders_devices:
            mine.sort(key=lambda a: position[a])  # stable: by index among equals
        if mine:
            nodes.append((sum(position[a] for a in mine) / len(mine), ni, mine))
    return [a for _, _, mine in sorted(nodes) for a in mine]


def uniform_structure(plan: Plan, profile: ModelProfile, cluster: Cluster, runtime: Runtime) -> Uniform:
    """The closest structure ``runtime`` can express to ``plan`` (see the module docstring).

    Each stage count the plan's pipelines use is a candidate (capped by what the runtime can cut);
    with more than one, the simulator picks: the fastest that fits in memory.
    """
    cap = min(runtime.max_stages(profile), len(plan.all_devices()))
    counts = sorted({min(len(p.stages), cap) for p in plan.pipelines})
    candidates = [_structure(plan, profile, cluster, runtime, stages) for stages in counts]
    if len(candidates) == 1:
        return candidates[0]

    def score(u: Uniform) -> tuple[bool, float]:
        sim = simulate(u.plan(plan), profile, cluster)
        return (not all(d.memory.fits for d in sim.devices.values()), sim.iteration_s)

    return min(candidates, key=score)  # the fewer stages on a tie (candidates ascend)


def _structure(plan: Plan, profile: ModelProfile, cluster: Cluster, runtime: Runtime, stages: int) -> Uniform:
    """The uniform structure with ``stages`` stages (see the module docstring)."""
    title = runtime.title
    dropped: list[str] = []
    n = len(profile.blocks)
    g = plan.global_batch
    tp, recompute, zero = _parallel_settings(plan, runtime, dropped)
    # with TP, each group is one unit (its first device stands for it) and keeps its devices together
    group_of = {r[0]: r for p in plan.pipelines for s in p.stages for r in s.replicas} if tp > 1 else {}
    used = list(group_of) if tp > 1 else plan.all_devices()

    others = sorted({len(p.stages) for p in plan.pipelines} - {stages})
    if others:
        items = [f"pipeline {i}: {len(p.stages)}" for i, p in enumerate(plan.pipelines)]
        counts = ", ".join(items) if len(items) <= 4 else ", ".join(items[:3]) + f", and {len(items) - 3} more"
        if stages in {len(p.stages) for p in plan.pipelines}:
            why = " (of the plan's stage counts, the one the simulator finds fastest)"
        else:
            why = f" (at most {stages}: {title} cannot cut this model finer)"
        dropped.append(f"stage counts ({counts}): every {title} pipeline has {stages}{why}")

    used_sizes: Counter[int] = Counter()  # per device: a replicated stage splits each micro-batch
    for p in plan.pipelines:
        for s in p.stages:
            for share in s.shares:
                for m in p.micro_batches:
                    k = max(1, round(m * share))
                    used_sizes[k] += k
    preferred = max(used_sizes, key=lambda m: (used_sizes[m], m))  # the size most samples go through

    fit = len(used) // stages
    replicas = max(d for d in range(1, fit + 1) if g % d == 0)
    idle_count = len(used) - stages * replicas
    index = {d.address: i for i, d in enumerate(cluster.devices)}
    slowest = sorted(used, key=lambda a: (-_device_seconds(profile, cluster, a, preferred), -index[a]))
    idle = sorted(slowest[:idle_count], key=index.__getitem__)
    if idle:
        why = f"; {fit} replicas would not divide the global batch {g}" if fit > replicas else ""
        dropped.append(
            f"{len(idle)} device(s) left idle, the slowest ({', '.join(idle)}): {stages} stages x {replicas} "
            f"replicas use {stages * replicas} of the plan's {len(used)} devices{why}"
        )
    ranks = _rank_order(plan, cluster, set(used) - set(idle), orders_devices=runtime.orders_devices)
    devices = [d for rep in ranks for d in group_of.get(rep, (rep,))]

    reference = _reference_cut(plan, stages, n)
    cuts = runtime.choose_cuts(profile, stages, reference)
    own = {(*(s.start for s in p.stages), n) for p in plan.pipelines}
    if own != {cuts.bounds}:
        described = [f"pipeline {i} at {[*(s.start for s in p.stages), n]}" for i, p in enumerate(plan.pipelines)]
        said = f"at {list(next(iter(own)))}" if len(own) == 1 else _some(described)
        dropped.append(
            f"layer partition (hetplan cuts {said}): every {title} pipeline cuts at "
            f"{list(cuts.bounds)}" + (f" ({cuts.note})" if cuts.note else "")
        )

    batch = g // replicas
    micro = max(m for m in range(1, min(preferred, batch) + 1) if batch % m == 0)
    count = batch // micro
    micro_line = -1  # where the micro-batch line is, rewritten if a smaller size must be taken to fit
    if any(set(p.micro_batches) != {micro} for p in plan.pipelines):
        split = any(len(set(p.micro_batches)) > 1 for p in plan.pipelines)
        described = [f"pipeline {i}: {_sizes(p.micro_batches)}" for i, p in enumerate(plan.pipelines)]
        micro_line = len(dropped)
        dropped.append(
            f"micro-batch sizes{' with startup splitting' if split else ''} ({_some(described)}): one size "
            f"{micro}, {count} per replica"
        )
    if len({p.batch for p in plan.pipelines}) > 1 or len(plan.pipelines) != replicas:
        batches = tuple(p.batch for p in plan.pipelines)
        shares = "/".join(map(str, batches)) if len(batches) <= 8 else _sizes(batches)
        each = f"each of the {replicas} replicas takes" if replicas > 1 else "the one replica takes"
        dropped.append(f"batch shares {shares} (by pipeline speed): {each} {batch}")
    replicated = [
        f"pipeline {pi} stage {si} on {', '.join(s.devices)} (shares {'/'.join(f'{x:.2g}' for x in s.shares)})"
        for pi, p in enumerate(plan.pipelines)
        for si, s in enumerate(p.stages)
        if s.replicated
    ]
    if replicated:
        dropped.append(
            f"stages replicated inside a pipeline ({_some(replicated)}): {title} replicates whole pipelines, "
            "each replica a whole micro-batch"
        )

    stage_of = {d: r // replicas for r, d in enumerate(ranks)}
    moved = [
        f"{d} from stage {si} to {stage_of[d]}"
        for p in plan.pipelines
        if len(p.stages) == stages
        for si, s in enumerate(p.stages)
        for d in s.devices
        if d in stage_of and stage_of[d] != si
    ]
    if moved:
        dropped.append(
            f"device placement ({_some(moved)}): {title} numbers ranks node by node and runs rank r on "
            f"stage r // {replicas}"
        )

    schedule = plan.schedule if plan.schedule in runtime.schedules else runtime.schedules[0]
    if schedule != plan.schedule:
        dropped.append(f"schedule {plan.schedule}: {title} runs {schedule}")
    optimizer = plan.optimizer if plan.optimizer in runtime.optimizers else runtime.optimizers[0]
    if optimizer != plan.optimizer:
        dropped.append(f"optimizer {plan.optimizer}: {title} has no such optimizer; it runs {optimizer}")
    dropped.extend(runtime.notes(plan, profile))

    uniform = Uniform(
        runtime=runtime.name,
        global_batch=g,
        stages=stages,
        replicas=replicas,
        micro_batch=micro,
        micro_batches=count,
        cuts=cuts.bounds,
        ranks=tuple(devices),
        schedule=schedule,
        optimizer=optimizer,
        dtype=plan.dtype,
        settings=dict(cuts.settings),
        dropped=tuple(dropped),
        tensor_parallel=tp,
        recompute=recompute,
        zero=zero,
    )
    return _fitting_micro_batch(uniform, plan, profile, cluster, micro_line)


def _fits(u: Uniform, plan: Plan, profile: ModelProfile, cluster: Cluster) -> bool:
    return all(d.memory.fits for d in simulate(u.plan(plan), profile, cluster).devices.values())


def _fitting_micro_batch(u: Uniform, plan: Plan, profile: ModelProfile, cluster: Cluster, line: int) -> Uniform:
    """``u``, or with the largest smaller micro-batch size (a divisor of a replica's batch) that fits
    in memory where ``u`` does not: one size on every device must suit the smallest device, where
    hetplan gave each its own. ``u`` unchanged when none fits (the export is then refused)."""
    if _fits(u, plan, profile, cluster):
        return u
    batch = u.global_batch // u.replicas
    for m in range(u.micro_batch - 1, 0, -1):
        if batch % m:
            continue
        smaller = replace(u, micro_batch=m, micro_batches=batch // m)
        if _fits(smaller, plan, profile, cluster):
            dropped = list(u.dropped)
            why = f"{m}, {batch // m} per replica (size {u.micro_batch} does not fit in memory on every device)"
            if line >= 0:
                dropped[line] = dropped[line].rsplit("): one size ", 1)[0] + f"): one size {why}"
            else:
                dropped.append(f"micro-batch size {u.micro_batch}: one size {why}")
            return replace(smaller, dropped=tuple(dropped))
    return u


def _parallel_settings(plan: Plan, runtime: Runtime, dropped: list[str]) -> tuple[int, str, int]:
    """The runtime's one TP degree, recomputation and ZeRO setting for the plan's per-stage ones:
    the plan's own where uniform (and the runtime can say them), else the most used (by devices)."""
    stages = [s for p in plan.pipelines for s in p.stages]
    by_degree: Counter[int] = Counter()
    by_recompute: Counter[str] = Counter()
    for s in stages:
        by_degree[s.tensor_parallel] += len(s.devices)
        by_recompute[s.recompute] += len(s.devices)
    title = runtime.title
    if not runtime.tensor_parallel:
        tp = 1
        if set(by_degree) != {1}:
            dropped.append(f"tensor parallelism (TP {'/'.join(map(str, sorted(by_degree)))}): {title} runs TP 1 here")
    else:
        # one degree for the whole model where the plan has one; TP groups of mixed sizes cannot be
        # regrouped into the runtime's one grid, so mixed degrees export at TP 1
        tp = next(iter(by_degree)) if len(by_degree) == 1 else 1
        if len(by_degree) > 1:
            described = ", ".join(f"TP {t} on {k} devices" for t, k in sorted(by_degree.items()))
            dropped.append(f"tensor-parallel degree per stage ({described}): every {title} stage runs TP {tp}")
    asked = max(by_recompute, key=lambda r: (by_recompute[r], r))
    recompute = next((r for r in RECOMPUTE_FALLBACK[asked] if r in runtime.recompute), "none")
    if len(by_recompute) > 1:
        described = ", ".join(f"{r} on {k} devices" for r, k in sorted(by_recompute.items()))
        dropped.append(f"recomputation per stage ({described}): every {title} stage recomputes {recompute}")
    elif recompute != asked:
        dropped.append(f"recomputation {asked}: {title} cannot say it; every stage recomputes {recompute}")
    zero = plan.zero if runtime.zero else 0
    if plan.zero and not runtime.zero:
        dropped.append(f"ZeRO-1: {title} keeps the whole optimizer state on every replica here")
    return tp, recompute, zero

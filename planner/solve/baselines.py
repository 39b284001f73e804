"""The plans users know, on the same inputs and scored by the same simulator.

* ``uniform``: the best searched plan's pipelines (before the baselines compete and before
  refinement), the same number of blocks per stage, equal batches.
* ``deepspeed_parameters``: cuts balancing parameter counts (DeepSpeed's ``partition_method=
  "parameters"``), equal batches.
* ``torchgpipe_time``: cuts balancing per-block time measured on one device type, the first stage's
  (torchgpipe's ``balance_by_time``), blind to the other types; equal batches.
* ``homogeneous_slowest`` / ``homogeneous_average``: hetplan's own search run as if every device were
  the slowest type / an average one (DAPPLE and Piper assume one device type), then simulated on
  the real devices.
* ``data_parallel_equal`` / ``data_parallel_proportional``: every device holds the whole model;
  equal batches, or batches in proportion to device speed (Stannis).
* ``megatron_uniform``: the fastest of the Megatron-style uniform plans (:func:`uniform_tp_pp_plans`):
  the same tensor-parallel degree TP and pipeline depth PP everywhere, blocks split evenly, data
  parallel over the rest with equal batches, ranks placed as Megatron numbers them (TP fastest,
  then data parallel, then pipeline, over the devices in file order), the first recomputation
  (none, selective, full) and ZeRO-1 setting (off, on) that fit, and the reference plan's
  micro-batch size (smaller where it does not fit).

A baseline that cannot fit in memory is reported as such (None).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import TypeVar

import numpy as np

from hetplan.contracts.cluster import Cluster, parse_cluster
from hetplan.contracts.model_profile import ModelProfile, Timing
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.errors import HetplanError
from hetplan.simulate.bounds import iteration_lower_bound
from hetplan.simulate.costs import CostModel
from hetplan.simulate.simulator import SimResult, memory_if_fits, simulate_walked
from hetplan.solve.background import Deferred
from hetplan.solve.batching import micro_batch_list
from hetplan.solve.search import Candidate, PlanOptions, search_only, simulate_or_none
from hetplan.solve.tables import CostTables

__all__ = [
    "BASELINES",
    "balanced_cuts",
    "baseline_plans",
    "equal_shares",
    "fastest_uniform_tp_pp",
    "homogeneous_baselines",
    "uniform_tp_pp_plans",
]

K = TypeVar("K", bound=Hashable)

_UNSEEN = object()  # "not given" / "not simulated yet" (None means "does not fit")

BASELINES = (
    "uniform",
    "deepspeed_parameters",
    "torchgpipe_time",
    "homogeneous_slowest",
    "homogeneous_average",
    "data_parallel_equal",
    "data_parallel_proportional",
    "megatron_uniform",
)


def equal_shares(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def balanced_cuts(weights: list[float], stages: int) -> list[int]:
    """Contiguous split of ``weights`` into ``stages`` non-empty parts minimising the largest part
    (exact DP; what DeepSpeed's and torchgpipe's balancers aim for)."""
    n = len(weights)
    prefix = np.concatenate([[0.0], np.cumsum(weights)])
    inf = float("inf")
    value = np.full((stages + 1, n + 1), inf)
    choice = np.zeros((stages + 1, n + 1), dtype=int)
    value[0, 0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, n + 1):
            i = np.arange(s - 1, j)
            cand = np.maximum(value[s - 1, i], prefix[j] - prefix[i])
            k = int(np.argmin(cand))
            value[s, j], choice[s, j] = cand[k], i[k]
    cuts = [n]
    for s in range(stages, 0, -1):
        cuts.append(int(choice[s, cuts[-1]]))
    return cuts[::-1]


def _memo(fn: Callable[[K], list[int]]) -> Callable[[K], list[int]]:
    """``fn`` computed once per argument (a fresh list each call: the callers keep what they get)."""
    seen: dict[K, list[int]] = {}

    def cached(key: K) -> list[int]:
        if key not in seen:
            seen[key] = fn(key)
        return list(seen[key])

    return cached


def _recut(reference: Plan, cuts_for: list[list[int]], shares: list[int]) -> Plan:
    pipes = []
    for p, cuts, batch in zip(reference.pipelines, cuts_for, shares, strict=True):
        m = max(p.micro_batches)
        stages = tuple(replace(s, start=cuts[i], end=cuts[i + 1]) for i, s in enumerate(p.stages))
        pipes.append(Pipeline(batch, micro_batch_list(batch, min(m, batch)), stages))
    return replace(reference, pipelines=pipes, predicted={}, baselines={}, details={})


def _common_degrees(profile: ModelProfile, index: int, types: list) -> set[int]:
    """The TP degrees of block ``index`` that every one of ``types`` has times for."""
    return set.intersection(*(set(profile.tp_degrees(index, t)) for t in types))


def _average_times(profile: ModelProfile, index: int, types: list, tp: int) -> dict[int, Timing]:
    """Block ``index``'s times at degree ``tp`` averaged over ``types``, at every size one of them
    was timed at (selective recomputation's forward averaged too)."""
    sizes = sorted({m for by in profile.blocks[index].times_at(tp).values() for m in by})
    recomputes = profile.blocks[index].shard(tp).selective_bytes > 0
    return {
        m: Timing(
            fwd=float(np.mean([profile.block_time(index, t, m, tp)[0] for t in types])),
            bwd=float(np.mean([profile.block_time(index, t, m, tp)[1] for t in types])),
            source="estimated",
            recompute=float(np.mean([profile.recompute_time(index, t, m, tp) for t in types])) if recomputes else None,
        )
        for m in sizes
    }


def _homogeneous_inputs(profile: ModelProfile, cluster: Cluster, mode: str) -> tuple[ModelProfile, Cluster]:
    """A profile and cluster in which every device is one type: the slowest, or an average one."""
    types = list(cluster.device_types.values())
    n = len(profile.blocks)

    def total(t) -> float:
        return sum(sum(profile.block_time(i, t, 1)) for i in range(n))

    slowest = max(types, key=lambda t: (total(t), t.name))
    name = slowest.name if mode == "slowest" else "homogeneous-average"
    memory = min(t.memory for t in types)
    blocks = []
    for i, b in enumerate(profile.blocks):
        # only the TP degrees every type has times for: the plan runs on the real devices after
        common = _common_degrees(profile, i, types)
        if mode == "average":  # at degree 1 and at every such degree, the types' times averaged
            parallel = {
                t: replace(data, times={**data.times, name: _average_times(profile, i, types, t)})
                for t, data in b.tensor_parallel.items()
                if t in common
            }
            b = replace(b, times={**b.times, name: _average_times(profile, i, types, 1)}, tensor_parallel=parallel)
        elif any(t not in common for t in b.tensor_parallel):
            b = replace(b, tensor_parallel={t: data for t, data in b.tensor_parallel.items() if t in common})
        blocks.append(b)
    homogeneous_profile = replace(profile, blocks=blocks)
    spec_type = slowest if mode == "slowest" else replace(slowest, name=name, memory=memory, aliases=())
    data = {
        "schema": "hetplan/cluster/v1",
        "name": f"{cluster.name} as {name}",
        "nodes": [
            {
                "name": node.name,
                "devices": [
                    {
                        "type": spec_type.name,
                        "count": len(node.devices),
                        "spec": {
                            "memory": memory,
                            "memory_bandwidth": spec_type.memory_bandwidth,
                            "tflops": {k: v / 1e12 for k, v in spec_type.peak.items()},
                        },
                    }
                ]
                if mode == "average"
                else [{"type": slowest.name, "count": len(node.devices)}],
                "link": {"bandwidth": node.link.bandwidth, "latency": node.link.latency},
                "nic": node.nic_bandwidth,
            }
            for node in cluster.nodes
        ],
        "network": {"bandwidth": cluster.network.bandwidth, "latency": cluster.network.latency},
    }
    return homogeneous_profile, parse_cluster(data, file=cluster.file, catalog=cluster.catalog)


def _data_parallel(
    profile: ModelProfile, cluster: Cluster, reference_opts, proportional: bool, micro: int = 8
) -> Plan | None:
    devices = list(cluster.devices)
    batch = reference_opts.global_batch
    if batch < len(devices):
        devices = devices[:batch]
    if proportional:
        per_type: dict[str, float] = {}  # one sum per device type, not per device (512 devices: seconds)
        for d in devices:
            if d.type.name not in per_type:
                seconds = sum(sum(profile.block_time(i, d.type, 1)) for i in range(len(profile.blocks)))
                per_type[d.type.name] = 1.0 / seconds
        speed = [per_type[d.type.name] for d in devices]
        exact = [batch * s / sum(speed) for s in speed]
        shares = [max(1, math.floor(x)) for x in exact]
        order = sorted(range(len(devices)), key=lambda i: (-(exact[i] - math.floor(exact[i])), i))
        k = 0
        while sum(shares) < batch:
            shares[order[k % len(order)]] += 1
            k += 1
        while sum(shares) > batch:
            i = max(range(len(shares)), key=lambda j: (shares[j], -j))
            shares[i] -= 1
    else:
        shares = equal_shares(batch, len(devices))
    pipes = [
        Pipeline(b, micro_batch_list(b, min(micro, b)), (Stage(0, len(profile.blocks), (d.address,), (1.0,)),))
        for d, b in zip(devices, shares, strict=True)
    ]
    return Plan(
        global_batch=batch, pipelines=pipes, schedule=reference_opts.schedule, optimizer=reference_opts.optimizer
    )


def baseline_plans(
    profile: ModelProfile,
    cluster: Cluster,
    opts: PlanOptions,
    reference: Plan | None,
    *,
    homogeneous: dict[str, Candidate | None] | None = None,
    background: bool = False,
    megatron: Candidate | object | None = _UNSEEN,
) -> dict[str, Candidate | None]:
    """Every baseline as a scored :class:`~hetplan.solve.search.Candidate` (None where it does not fit);
    ``homogeneous``: :func:`homogeneous_baselines` already computed (they need no reference, so a
    caller may run them beside its own search); ``megatron``: :func:`fastest_uniform_tp_pp` already
    computed; ``background``: the Megatron-style family is scored in a second process meanwhile
    (:mod:`hetplan.solve.background`; the same answer)."""
    if megatron is not _UNSEEN:
        out = _baselines_here(profile, cluster, opts, reference, homogeneous)
        out["megatron_uniform"] = megatron  # type: ignore[assignment]
        return {name: out[name] for name in BASELINES}
    deferred = Deferred(fastest_uniform_tp_pp, profile, cluster, opts, reference, background=background)
    try:
        out = _baselines_here(profile, cluster, opts, reference, homogeneous)
        out["megatron_uniform"] = deferred.result()
    finally:
        deferred.close()
    return {name: out[name] for name in BASELINES}


def _baselines_here(
    profile: ModelProfile,
    cluster: Cluster,
    opts: PlanOptions,
    reference: Plan | None,
    homogeneous: dict[str, Candidate | None] | None,
) -> dict[str, Candidate | None]:
    """The baselines but the Megatron-style one, in this process."""
    out: dict[str, Candidate | None] = {}
    score = _Scorer(profile, cluster)
    n = len(profile.blocks)
    if reference is not None:
        shares = equal_shares(opts.global_batch, len(reference.pipelines))
        uniform = [[round(i * n / len(p.stages)) for i in range(len(p.stages) + 1)] for p in reference.pipelines]
        out["uniform"] = score("uniform", _recut(reference, uniform, shares))
        # as DeepSpeed counts them: a tied layer's parameters in every layer holding it
        params = [profile.block_params(i)[0] + 1e-9 for i in range(len(profile.blocks))]
        # one DP per distinct input: a 512-device reference has hundreds of pipelines of a few depths
        by_params = _memo(lambda stages: balanced_cuts(params, stages))
        out["deepspeed_parameters"] = score(
            "deepspeed_parameters", _recut(reference, [by_params(len(p.stages)) for p in reference.pipelines], shares)
        )
        firsts = [cluster.device(p.stages[0].devices[0]).type for p in reference.pipelines]
        types = {t.name: t for t in firsts}
        by_time = _memo(
            lambda key: balanced_cuts([sum(profile.block_time(i, types[key[0]], 1)) for i in range(n)], key[1])
        )
        cuts = [by_time((t.name, len(p.stages))) for t, p in zip(firsts, reference.pipelines, strict=True)]
        out["torchgpipe_time"] = score("torchgpipe_time", _recut(reference, cuts, shares))
    else:
        out.update(dict.fromkeys(("uniform", "deepspeed_parameters", "torchgpipe_time")))
    out.update(homogeneous if homogeneous is not None else homogeneous_baselines(profile, cluster, opts))
    sizes = sorted(opts.micro_batch_sizes or (1, 2, 4, 8), reverse=True)
    for name, proportional in (("data_parallel_equal", False), ("data_parallel_proportional", True)):
        # the largest micro-batch (up to 8, or the sizes asked for) at which every device holds the model
        for m in [s for s in sizes if s <= 8] or sizes[-1:]:
            out[name] = score(name, _data_parallel(profile, cluster, opts, proportional=proportional, micro=m))
            if out[name] is not None:
                break
    return out


def homogeneous_baselines(profile: ModelProfile, cluster: Cluster, opts: PlanOptions) -> dict[str, Candidate | None]:
    """``homogeneous_slowest`` and ``homogeneous_average``: hetplan's search on the cluster taken as
    one device type, its plan simulated on the real devices."""
    inner = PlanOptions(
        global_batch=opts.global_batch,
        schedule=opts.schedule,
        optimizer=opts.optimizer,
        micro_batch_sizes=opts.micro_batch_sizes,
        max_stages=opts.max_stages,
        top_k=1,
        refine=False,
        baselines=False,
    )
    score = _Scorer(profile, cluster)
    out: dict[str, Candidate | None] = {}
    for mode in ("slowest", "average"):
        h_profile, h_cluster = _homogeneous_inputs(profile, cluster, mode)
        try:
            h_plan = search_only(h_profile, h_cluster, inner, bound=False).plan
        except HetplanError:  # nothing fits when every device is taken as that type: a result
            h_plan = None
        out[f"homogeneous_{mode}"] = score(f"homogeneous_{mode}", h_plan)
    return out


class _Scorer:
    """A baseline plan simulated on the real cluster, as a candidate (None where it does not fit or
    there is no plan); plans that run alike are simulated once (equal layers give equal cuts)."""

    def __init__(self, profile: ModelProfile, cluster: Cluster) -> None:
        self.profile, self.cluster = profile, cluster
        self.scored: list[tuple[Plan, SimResult | None]] = []

    def __call__(self, name: str, plan: Plan | None) -> Candidate | None:
        if plan is None:
            return None
        same = next((sim for seen, sim in self.scored if _runs_alike(seen, plan)), _UNSEEN)
        if same is _UNSEEN:
            same = simulate_or_none(plan, self.profile, self.cluster)
            self.scored.append((plan, same))
        return Candidate(name, plan, float("nan"), same) if same is not None else None


def _runs_alike(a: Plan, b: Plan) -> bool:
    """The two plans run the same iteration (what the simulator reads is equal; their predictions,
    details and file may differ)."""
    fields = ("global_batch", "pipelines", "schedule", "dtype", "optimizer", "sync", "sync_options", "zero")
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def _megatron_layout(cluster: Cluster, tp: int, pp: int, batch: int) -> list[list[list[str]]] | None:
    """Devices of each pipeline's stages as Megatron numbers ranks (TP fastest, then data parallel,
    then pipeline) over the devices in file order; None where TP groups would cross a node or mix types."""
    devices = list(cluster.devices)
    replicas = min(len(devices) // (tp * pp), batch)
    if replicas < 1:
        return None
    ranks = devices[: replicas * tp * pp]
    pipes: list[list[list[str]]] = [[] for _ in range(replicas)]
    for s in range(pp):
        for d in range(replicas):
            group = ranks[(s * replicas + d) * tp : (s * replicas + d + 1) * tp]
            if len({(x.node, x.type.name) for x in group}) > 1:
                return None
            pipes[d].append([x.address for x in group])
    return pipes


class _UniformPlans:
    """The Megatron-style plans of one layout and degree: blocks split evenly, equal batches. A
    family tries up to 24 settings that share their stages (per recomputation) and pipelines (per
    micro-batch size and recomputation): each is built once (a 512-device plan is thousands of
    objects), every plan gets its own list of them."""

    def __init__(self, layout: list[list[list[str]]], tables: CostTables, opts: PlanOptions, tp: int) -> None:
        n = tables.n
        pp = len(layout[0])
        self.layout, self.opts, self.tp = layout, opts, tp
        self.cuts = [round(i * n / pp) for i in range(pp + 1)]
        # a stage holds a block without that degree (an embedding, say), or without times for a
        # type it lands on at that degree: no plan at all
        types = [{tables.cluster.device(a).type.name for groups in layout for a in groups[i]} for i in range(pp)]
        self.possible = all(
            tp in tables.tp_options(self.cuts[i], self.cuts[i + 1], t) for i in range(pp) for t in sorted(types[i])
        )
        self.shares = equal_shares(opts.global_batch, len(layout))
        self._stages: dict[str, list[tuple[Stage, ...]]] = {}
        self._pipelines: dict[tuple[int, str], list[Pipeline]] = {}

    def plan(self, m: int, recompute: str, zero: int) -> Plan:
        """The plan at micro-batch size ``m`` (smaller where a share is), ``recompute`` and ``zero``."""
        pipes = self._pipelines.get((m, recompute))
        if pipes is None:
            stages = self._stages.get(recompute)
            if stages is None:
                cuts, tp = self.cuts, self.tp
                stages = self._stages[recompute] = [
                    tuple(
                        Stage(cuts[i], cuts[i + 1], tuple(group), (1.0,), tensor_parallel=tp, recompute=recompute)
                        for i, group in enumerate(groups)
                    )
                    for groups in self.layout
                ]
            pipes = self._pipelines[(m, recompute)] = [
                Pipeline(b, micro_batch_list(b, min(m, b)), held) for held, b in zip(stages, self.shares, strict=True)
            ]
        opts = self.opts
        return Plan(
            global_batch=opts.global_batch,
            pipelines=list(pipes),
            schedule=opts.schedule,
            optimizer=opts.optimizer,
            zero=zero,
        )


def uniform_tp_pp_plans(
    profile: ModelProfile, cluster: Cluster, opts: PlanOptions, reference: Plan | None
) -> dict[str, Candidate | None]:
    """``"TP t x PP p"`` -> the Megatron-style uniform plan (see the module docstring), scored by the
    simulator, for every degree the profile has and every depth up to ``opts.max_stages`` and the
    blocks; None where it does not fit (or cannot be laid out: a TP group across nodes)."""
    out: dict[str, Candidate | None] = {}
    for name, configs in _uniform_families(profile, cluster, opts, reference).items():
        out[name] = None
        for plan in configs:
            sim = simulate_or_none(plan, profile, cluster)
            if sim is not None:
                out[name] = Candidate(name, plan, float("nan"), sim)
                break
    return out


def fastest_uniform_tp_pp(
    profile: ModelProfile, cluster: Cluster, opts: PlanOptions, reference: Plan | None
) -> Candidate | None:
    """The fastest of :func:`uniform_tp_pp_plans` (the first in its order among equals), simulating
    only what could still win: each family's settings in preference order are memory-checked and
    simulated in the order of :func:`~hetplan.simulate.bounds.iteration_lower_bound`, until the best
    simulated iteration is below every bound left. Same answer; on 512 devices a few event runs
    instead of twenty."""
    families = _uniform_families(profile, cluster, opts, reference)
    costs = CostModel(profile, cluster, optimizer=opts.optimizer)
    members: dict[tuple, tuple] = {}  # a family's settings share one layout
    bounds = {
        name: [iteration_lower_bound(plan, profile, cluster, costs, members=members) for plan in configs]
        for name, configs in families.items()
    }
    heap = [(min(bounds[name]), order, name, 0) for order, name in enumerate(families) if families[name]]
    heapq.heapify(heap)
    best: tuple[float, int, Candidate] | None = None
    while heap:
        bound, order, name, i = heapq.heappop(heap)
        if best is not None and bound > best[0]:
            break
        plan = families[name][i]
        walked = memory_if_fits(plan, profile, cluster)
        if walked is None:  # the family's next setting is its plan now
            if i + 1 < len(families[name]):
                heapq.heappush(heap, (min(bounds[name][i + 1 :]), order, name, i + 1))
            continue
        sim = simulate_walked(plan, profile, cluster, walked)
        if best is None or (sim.iteration_s, order) < best[:2]:
            best = (sim.iteration_s, order, Candidate(name, plan, float("nan"), sim))
    return best[2] if best is not None else None


def _uniform_families(
    profile: ModelProfile, cluster: Cluster, opts: PlanOptions, reference: Plan | None
) -> dict[str, list[Plan]]:
    """``"TP t x PP p"`` -> its plans in preference order (micro-batch size, then recomputation
    none/selective/full, then ZeRO-1 off/on) that pass the closed-form memory check; the first of
    them the memory walk accepts is the family's plan. Empty where none could fit or it cannot be
    laid out (a TP group across nodes or types, a block without the degree)."""
    tables = CostTables(profile, cluster, optimizer=opts.optimizer)
    degrees = sorted({t for b in range(tables.n) for t in tables.tp_options(b, b + 1)})
    preferred = max(reference.pipelines[0].micro_batches) if reference is not None else 1
    sizes = sorted({m for m in (opts.micro_batch_sizes or (1, 2, 4, 8)) if m <= preferred} | {1}, reverse=True)
    out: dict[str, list[Plan]] = {}
    for tp in degrees:
        pp = 1
        while pp <= min(opts.max_stages, tables.n) and tp * pp <= len(cluster.devices):
            out[f"TP {tp} x PP {pp}"] = _settings(cluster, tables, opts, tp, pp, sizes)
            pp *= 2
    return out


def _settings(
    cluster: Cluster, tables: CostTables, opts: PlanOptions, tp: int, pp: int, sizes: list[int]
) -> list[Plan]:
    """One family's plans over (micro-batch size, recomputation, ZeRO) in preference order that the
    closed form lets through (the memory walk of a large plan is not free)."""
    layout = _megatron_layout(cluster, tp, pp, opts.global_batch)
    if layout is None:
        return []
    plans = _UniformPlans(layout, tables, opts, tp)
    if not plans.possible:
        return []
    out = []
    for m in sizes:
        for recompute in ("none", "selective", "full"):
            for zero in (0, 1) if len(layout) > 1 and not tables.profile.shared else (0,):  # ZeRO-1 refuses ties
                plan = plans.plan(m, recompute, zero)
                if _fits(plan, tables, cluster):
                    out.append(plan)
    return out


def _fits(plan: Plan, tables: CostTables, cluster: Cluster) -> bool:
    """Every stage fits by :meth:`CostTables.fits` on every device type it lands on (the pipelines
    run alike, but a later one may sit on smaller devices than the first)."""
    holders = len(plan.pipelines)
    seen: set[tuple] = set()
    for p in plan.pipelines:
        for si, s in enumerate(p.stages):
            device = cluster.device(s.devices[0]).type  # a TP group is one type
            key = (si, device.name, p.micro_batches)
            if key in seen:
                continue
            seen.add(key)
            if not tables.fits(
                device,
                s.start,
                s.end,
                m=max(p.micro_batches),
                in_flight=min(len(p.stages) - si, len(p.micro_batches)),
                tp=s.tensor_parallel,
                recompute=s.recompute,
                zero_holders=holders if plan.zero else 1,
                reduced=holders > 1,
            ):
                return False
    return True

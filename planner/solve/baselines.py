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

import math
from dataclasses import replace

import numpy as np

from hetplan.contracts.cluster import Cluster, parse_cluster
from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.errors import HetplanError
from hetplan.solve.batching import micro_batch_list
from hetplan.solve.search import Candidate, PlanOptions, search_only, simulate_or_none
from hetplan.solve.tables import CostTables

__all__ = ["BASELINES", "balanced_cuts", "baseline_plans", "equal_shares", "uniform_tp_pp_plans"]

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


def _recut(reference: Plan, cuts_for: list[list[int]], shares: list[int]) -> Plan:
    pipes = []
    for p, cuts, batch in zip(reference.pipelines, cuts_for, shares, strict=True):
        m = max(p.micro_batches)
        stages = tuple(replace(s, start=cuts[i], end=cuts[i + 1]) for i, s in enumerate(p.stages))
        pipes.append(Pipeline(batch, micro_batch_list(batch, min(m, batch)), stages))
    return replace(reference, pipelines=pipes, predicted={}, baselines={}, details={})


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
    sizes = sorted({m for b in profile.blocks for by in b.times.values() for m in by})
    for i, b in enumerate(profile.blocks):
        times = dict(b.times)
        if mode == "average":
            times[name] = {
                m: Timing(
                    fwd=float(np.mean([profile.block_time(i, t, m)[0] for t in types])),
                    bwd=float(np.mean([profile.block_time(i, t, m)[1] for t in types])),
                    source="estimated",
                )
                for m in sizes
            }
        blocks.append(Block(**{**b.__dict__, "times": times}))
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
        speed = [1.0 / sum(sum(profile.block_time(i, d.type, 1)) for i in range(len(profile.blocks))) for d in devices]
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
    profile: ModelProfile, cluster: Cluster, opts: PlanOptions, reference: Plan | None
) -> dict[str, Candidate | None]:
    """Every baseline as a scored :class:`~hetplan.solve.search.Candidate` (None where it does not fit)."""
    out: dict[str, Candidate | None] = {}

    def score(name: str, plan: Plan | None) -> None:
        sim = simulate_or_none(plan, profile, cluster) if plan is not None else None
        out[name] = Candidate(name, plan, float("nan"), sim) if sim is not None else None

    n = len(profile.blocks)
    if reference is not None:
        shares = equal_shares(opts.global_batch, len(reference.pipelines))
        uniform = [[round(i * n / len(p.stages)) for i in range(len(p.stages) + 1)] for p in reference.pipelines]
        score("uniform", _recut(reference, uniform, shares))
        params = [float(b.params) + 1e-9 for b in profile.blocks]
        score(
            "deepspeed_parameters",
            _recut(reference, [balanced_cuts(params, len(p.stages)) for p in reference.pipelines], shares),
        )
        cuts = []
        for p in reference.pipelines:
            first = cluster.device(p.stages[0].devices[0]).type
            times = [sum(profile.block_time(i, first, 1)) for i in range(n)]
            cuts.append(balanced_cuts(times, len(p.stages)))
        score("torchgpipe_time", _recut(reference, cuts, shares))
    else:
        out.update(dict.fromkeys(("uniform", "deepspeed_parameters", "torchgpipe_time")))
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
    for mode in ("slowest", "average"):
        h_profile, h_cluster = _homogeneous_inputs(profile, cluster, mode)
        try:
            h_plan = search_only(h_profile, h_cluster, inner).plan
        except HetplanError:  # nothing fits when every device is taken as that type: a result
            h_plan = None
        score(f"homogeneous_{mode}", h_plan)
    family = uniform_tp_pp_plans(profile, cluster, opts, reference)
    fitting = [c for c in family.values() if c is not None]
    out["megatron_uniform"] = min(fitting, key=lambda c: c.sim.iteration_s) if fitting else None
    sizes = sorted(opts.micro_batch_sizes or (1, 2, 4, 8), reverse=True)
    for name, proportional in (("data_parallel_equal", False), ("data_parallel_proportional", True)):
        # the largest micro-batch (up to 8, or the sizes asked for) at which every device holds the model
        for m in [s for s in sizes if s <= 8] or sizes[-1:]:
            score(name, _data_parallel(profile, cluster, opts, proportional=proportional, micro=m))
            if out[name] is not None:
                break
    return out


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


def _uniform_plan(
    layout: list[list[list[str]]], tables: CostTables, opts: PlanOptions, tp: int, m: int, recompute: str, zero: int
) -> Plan | None:
    n = tables.n
    pp = len(layout[0])
    cuts = [round(i * n / pp) for i in range(pp + 1)]
    if any(tp not in tables.tp_options(cuts[i], cuts[i + 1]) for i in range(pp)):
        return None  # a stage holds a block without that degree (an embedding, say)
    shares = equal_shares(opts.global_batch, len(layout))
    pipes = [
        Pipeline(
            b,
            micro_batch_list(b, min(m, b)),
            tuple(
                Stage(cuts[i], cuts[i + 1], tuple(group), (1.0,), tensor_parallel=tp, recompute=recompute)
                for i, group in enumerate(stages)
            ),
        )
        for stages, b in zip(layout, shares, strict=True)
    ]
    return Plan(
        global_batch=opts.global_batch, pipelines=pipes, schedule=opts.schedule, optimizer=opts.optimizer, zero=zero
    )


def uniform_tp_pp_plans(
    profile: ModelProfile, cluster: Cluster, opts: PlanOptions, reference: Plan | None
) -> dict[str, Candidate | None]:
    """``"TP t x PP p"`` -> the Megatron-style uniform plan (see the module docstring), scored by the
    simulator, for every degree the profile has and every depth up to ``opts.max_stages`` and the
    blocks; None where it does not fit (or cannot be laid out: a TP group across nodes)."""
    tables = CostTables(profile, cluster, optimizer=opts.optimizer)
    degrees = sorted({t for b in range(tables.n) for t in tables.tp_options(b, b + 1)})
    preferred = max(reference.pipelines[0].micro_batches) if reference is not None else 1
    sizes = sorted({m for m in (opts.micro_batch_sizes or (1, 2, 4, 8)) if m <= preferred} | {1}, reverse=True)
    out: dict[str, Candidate | None] = {}
    for tp in degrees:
        pp = 1
        while pp <= min(opts.max_stages, tables.n) and tp * pp <= len(cluster.devices):
            out[f"TP {tp} x PP {pp}"] = _first_fitting(profile, cluster, tables, opts, tp, pp, sizes)
            pp *= 2
    return out


def _first_fitting(
    profile: ModelProfile, cluster: Cluster, tables: CostTables, opts: PlanOptions, tp: int, pp: int, sizes: list[int]
) -> Candidate | None:
    """The first of (micro-batch size, recomputation, ZeRO) in preference order that fits, scored."""
    layout = _megatron_layout(cluster, tp, pp, opts.global_batch)
    if layout is None:
        return None
    for m in sizes:
        for recompute in ("none", "selective", "full"):
            for zero in (0, 1) if len(layout) > 1 else (0,):
                plan = _uniform_plan(layout, tables, opts, tp, m, recompute, zero)
                if plan is None:
                    return None
                if not _fits(plan, tables, cluster):
                    continue  # the closed form first: the memory walk of a large plan is not free
                sim = simulate_or_none(plan, profile, cluster)
                if sim is not None:
                    return Candidate(f"TP {tp} x PP {pp}", plan, float("nan"), sim)
    return None


def _fits(plan: Plan, tables: CostTables, cluster: Cluster) -> bool:
    """Every stage of the first pipeline fits by :meth:`CostTables.fits` (all pipelines are alike)."""
    p = plan.pipelines[0]
    holders = len(plan.pipelines)
    for si, s in enumerate(p.stages):
        held = min(len(p.stages) - si, len(p.micro_batches))
        device = cluster.device(s.devices[0]).type
        if not tables.fits(
            device,
            s.start,
            s.end,
            m=max(p.micro_batches),
            in_flight=held,
            tp=s.tensor_parallel,
            recompute=s.recompute,
            zero_holders=holders if plan.zero else 1,
            reduced=holders > 1,
        ):
            return False
    return True

"""The planner against exhaustive enumeration on random small heterogeneous instances.

The space (tests/solve/brute_force.py): stages of one device or two of one type on one node (two
replicas or a tensor-parallel group of 2), micro-batches of 1 or 2 per pipeline, recomputation
per stage, every cut and batch split. To keep the brute force affordable the instances are at
most 4 devices, batches up to 4, and the model shrinks until the space has at most
``SPACE_LIMIT`` plans.
"""

from __future__ import annotations

import brute_force
import pytest
from builders import make_cluster
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from hetplan.contracts.model_profile import Block, ModelProfile, TensorParallel, Timing
from hetplan.contracts.plan import Plan
from hetplan.errors import HetplanError
from hetplan.simulate import simulate
from hetplan.solve import PlanOptions, plan_training

TYPES = ["A100-80GB", "V100-16GB", "T4"]
SPACE_LIMIT = 1500  # plans the brute force may simulate per instance (keeps the suite fast)


def tp_profile(
    per_block: dict[str, list[tuple[float, float]]],
    *,
    n_blocks: int,
    params: int,
    activation_bytes: float,
    output_bytes: float,
    tp_speedup: float | None,
    allreduce_bytes: float,
    pair: float,
) -> ModelProfile:
    """Blocks with times per type at micro-batch 1, and ``pair`` times those at 2 (below 2: two
    samples run more efficiently together); with ``tp_speedup``, a
    degree-2 split of each (compute per device divided by it, half the parameters and activations,
    the Megatron all-reduce of ``allreduce_bytes`` per sample); half of the activations are what
    selective recomputation drops, at a quarter of the forward."""

    def timing(f: float, b: float, scale: float = 1.0) -> dict[int, Timing]:
        return {
            m: Timing(fwd=f * k * scale, bwd=b * k * scale, source="estimated", recompute=0.25 * f * k * scale)
            for m, k in ((1, 1.0), (2, pair))
        }

    blocks = []
    for i in range(n_blocks):
        tp = {}
        if tp_speedup is not None:
            tp[2] = TensorParallel(
                params=params // 2,
                param_bytes=float(params // 2 * 4),
                activation_bytes=activation_bytes / 2,
                allreduce_bytes=allreduce_bytes,
                times={t: timing(*v[i], 1.0 / tp_speedup) for t, v in per_block.items()},
                selective_bytes=activation_bytes / 4,
            )
        blocks.append(
            Block(
                name=f"b{i}",
                kind="test",
                params=params,
                param_bytes=float(params * 4),
                activation_bytes=activation_bytes,
                output_bytes=output_bytes,
                flops_fwd=0.0,
                times={t: timing(*v[i]) for t, v in per_block.items()},
                selective_bytes=activation_bytes / 2,
                tensor_parallel=tp,
            )
        )
    return ModelProfile(model={"name": "test"}, dtype="fp32", blocks=blocks)


@st.composite
def instances(draw):
    n_types = draw(st.integers(2, 3))
    n_devices = draw(st.integers(2, 4))
    n_nodes = draw(st.integers(1, 2))
    types = [TYPES[draw(st.integers(0, n_types - 1))] for _ in range(n_devices)]
    nodes: dict[str, list[tuple[str, int]]] = {}
    for i, t in enumerate(types):
        node = f"n{draw(st.integers(0, n_nodes - 1)) if i else 0}"
        nodes.setdefault(node, []).append((t, 1))
    n_blocks = draw(st.integers(2, 8))
    base = [(draw(st.floats(0.1, 2.0)), draw(st.floats(0.1, 4.0))) for _ in range(n_blocks)]
    speed = {t: draw(st.floats(1.0, 4.0)) for t in TYPES}
    per_block = {t: [(f / speed[t], b / speed[t]) for f, b in base] for t in TYPES}
    shape = {
        "output_bytes": draw(st.sampled_from([0.0, 1e7, 1e8])),
        "params": draw(st.sampled_from([0, 10_000_000])),
        # per sample per block: none, or enough that V100s and T4s must recompute or split
        "activation_bytes": draw(st.sampled_from([0.0, 0.0, 3e9])),
        "tp_speedup": draw(st.sampled_from([None, 1.2, 1.9])),
        "allreduce_bytes": draw(st.sampled_from([1e6, 1e8])),
        "pair": draw(st.sampled_from([2.0, 1.5])),
    }
    batch = draw(st.integers(1, 4))
    inter = draw(st.sampled_from(["1GB/s", "10GB/s", "100Gbps"]))
    return nodes, n_blocks, per_block, shape, batch, inter


def _build(nodes, n_blocks, per_block, shape, inter):
    profile = tp_profile({t: v[:n_blocks] for t, v in per_block.items()}, n_blocks=n_blocks, **shape)
    merged = [(name, _merge(devices)) for name, devices in sorted(nodes.items())]
    cluster = make_cluster(merged, intra="50GB/s", inter=inter, inter_latency="10us")
    return profile, cluster


def _features(plan: Plan) -> list[str]:
    """What of the new dimensions a plan uses (the test's statistics: it must exercise each)."""
    stages = [s for p in plan.pipelines for s in p.stages]
    out = []
    if any(s.tensor_parallel > 1 for s in stages):
        out.append("a TP stage")
    if any(s.replicated for s in stages):
        out.append("a replicated stage")
    if any(s.recompute != "none" for s in stages):
        out.append("recomputation")
    sizes = {max(p.micro_batches) for p in plan.pipelines}
    if 2 in sizes:
        out.append("micro-batches of 2" + (" and 1" if 1 in sizes and len(plan.pipelines) > 1 else ""))
    return out


def _merge(devices: list[tuple[str, int]]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for t, c in devices:
        counts[t] = counts.get(t, 0) + c
    return list(counts.items())


def _found(nodes, n_blocks, per_block, *, batch, params, activation_bytes, tp_speedup, pair):
    """An instance a random run found, as :func:`instances` draws them (no boundary bytes, 1 MB
    all-reduces, 1 GB/s between nodes)."""
    shape = {
        "output_bytes": 0.0,
        "params": params,
        "activation_bytes": activation_bytes,
        "tp_speedup": tp_speedup,
        "allreduce_bytes": 1e6,
        "pair": pair,
    }
    return nodes, n_blocks, per_block, shape, batch, "1GB/s"


@settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(instance=instances())
# found by a longer random run: the optimum puts the bottleneck stage first (A100 > V100 > A100,
# cuts 0-3 | 3-4 | 4-5: 5.5 s); the DP's closed form ties it with 0-2 | 2-3 | 3-5 (6.5 s), and moving
# one cut at a time from there passes through a worse plan: the refinement slides a whole stage
@example(
    instance=_found(
        {"n0": [("A100-80GB", 1), ("A100-80GB", 1), ("V100-16GB", 1)]},
        5,
        {
            t: [(k * 0.25, k * 0.25)] * 4 + [(k * 0.25, k * 0.75)]
            for t, k in (("A100-80GB", 1), ("V100-16GB", 2), ("T4", 4))
        },
        batch=3,
        params=0,
        activation_bytes=0.0,
        tp_speedup=None,
        pair=2.0,
    )
)
# and a second: two TP-2 pipelines (A100s, V100s), two samples 1.5x one; the optimum runs 2 and 2
# samples at micro-batches 1 and 2 (2.81 s); the closed form prices 3 samples at micro-batch 2 (a
# remainder of 1) too cheaply and picks 3 + 1 (3.01 s); the refinement moves a sample and changes
# the two pipelines' micro-batch sizes in one step
@example(
    instance=_found(
        {"n0": [("A100-80GB", 1), ("A100-80GB", 1), ("V100-16GB", 1), ("V100-16GB", 1)]},
        2,
        {"A100-80GB": [(4 / 7, 4 / 7)] * 2, "V100-16GB": [(8 / 9, 8 / 9)] * 2, "T4": [(1.0, 1.0)] * 2},
        batch=4,
        params=0,
        activation_bytes=0.0,
        tp_speedup=1.9,
        pair=1.5,
    )
)
# and a third: the optimum cuts a TP-2 V100 stage one block later than the DP and so must recompute
# (selective) to fit; the refinement moves a cut together with one step of recomputation
@example(
    instance=_found(
        {"n0": [("A100-80GB", 1), ("V100-16GB", 1), ("V100-16GB", 1)]},
        7,
        {
            t: [
                (k * f, k * b)
                for f, b in ((0.69, 1.5), (0.5, 0.5), (0.5, 1.0), (1.0, 1.0), (0.5, 0.5), (0.5, 0.25), (0.5, 0.5))
            ]
            for t, k in (("A100-80GB", 1.0), ("V100-16GB", 8 / 11), ("T4", 2.0))
        },
        batch=2,
        params=0,
        activation_bytes=3e9,
        tp_speedup=1.9,
        pair=2.0,
    )
)
# and a fourth: A100 > TP-2 T4s with micro-batches 1 and 2; the DP's cut for that order is off by one
# and the candidate is not among the 24 best simulated ones: every candidate is refined now
@example(
    instance=_found(
        {"n0": [("A100-80GB", 1), ("T4", 1), ("T4", 1), ("T4", 1)]},
        3,
        {
            "A100-80GB": [(0.5, 0.5), (0.25, 0.25), (0.25, 0.5)],
            "V100-16GB": [(2.0, 2.0), (1.0, 1.0), (1.0, 2.0)],
            "T4": [(1.0, 1.0), (0.5, 0.5), (0.5, 1.0)],
        },
        batch=3,
        params=0,
        activation_bytes=0.0,
        tp_speedup=1.9,
        pair=1.5,
    )
)
# and a fifth: one pipeline TP-2 T4s > A100 with micro-batches 1 and 2, its DP cut 1 block early
# and its candidate 15% behind the best simulated one
@example(
    instance=_found(
        {"n0": [("A100-80GB", 1), ("T4", 1), ("T4", 1), ("T4", 1)]},
        3,
        {
            t: [(k * f, k * b) for f, b in ((1.0, 1.0), (0.17, 1.187), (0.1, 1.25))]
            for t, k in (("A100-80GB", 4 / 7), ("V100-16GB", 2.0), ("T4", 16 / 17))
        },
        batch=3,
        params=0,
        activation_bytes=0.0,
        tp_speedup=1.9,
        pair=1.5,
    )
)
# and a sixth: moving a sample to the V100 pipeline needs selective recomputation there to fit; a
# move that runs out of memory is retried with the recomputation it needs
@example(
    instance=_found(
        {"n0": [("A100-80GB", 1), ("V100-16GB", 1)]},
        2,
        {"A100-80GB": [(1 / 3, 1 / 3)] * 2, "V100-16GB": [(0.25, 0.25)] * 2, "T4": [(1.0, 1.0)] * 2},
        batch=3,
        params=10_000_000,
        activation_bytes=3e9,
        tp_speedup=None,
        pair=1.5,
    )
)
def test_planner_is_within_one_percent_of_exhaustive_search(instance) -> None:
    nodes, n_blocks, per_block, shape, batch, inter = instance
    profile, cluster = _build(nodes, n_blocks, per_block, shape, inter)
    while brute_force.space_size(profile, cluster, batch) > SPACE_LIMIT and n_blocks > 2:
        n_blocks -= 1  # shrink the model until the brute force stays affordable
        profile, cluster = _build(nodes, n_blocks, per_block, shape, inter)
    if brute_force.space_size(profile, cluster, batch) > SPACE_LIMIT:
        batch = 1
    opts = PlanOptions(global_batch=batch, optimizer="sgd", micro_batch_sizes=(1, 2), baselines=False)
    found = brute_force.best_plan(profile, cluster, batch)
    if found is None:  # nothing in the brute force's space fits: the planner finds nothing either
        event("nothing fits")
        with pytest.raises(HetplanError, match="no plan fits"):
            plan_training(profile, cluster, opts)
        return
    best_time, best = found
    for feature in _features(best):
        event(f"the optimum has {feature}")
    planned = plan_training(profile, cluster, opts)
    assert simulate(planned.plan, profile, cluster).iteration_s == planned.sim.iteration_s
    assert planned.sim.iteration_s <= best_time * 1.01, (
        f"planner {planned.sim.iteration_s:.6g} vs exhaustive {best_time:.6g}\n"
        f"planner: {planned.plan.to_dict()['pipelines']} zero {planned.plan.zero}\n"
        f"best: {best.to_dict()['pipelines']}"
    )

"""The planner against exhaustive enumeration on random small heterogeneous instances."""

from __future__ import annotations

import brute_force
from builders import make_cluster, make_profile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetplan.simulate import simulate
from hetplan.solve import PlanOptions, plan_training

TYPES = ["A100-80GB", "V100-16GB", "T4"]
SPACE_LIMIT = 2500  # plans the brute force may simulate per instance (keeps the suite fast)


@st.composite
def instances(draw):
    n_types = draw(st.integers(2, 3))
    n_devices = draw(st.integers(2, 6))
    n_nodes = draw(st.integers(1, 3))
    types = [TYPES[draw(st.integers(0, n_types - 1))] for _ in range(n_devices)]
    nodes: dict[str, list[tuple[str, int]]] = {}
    for i, t in enumerate(types):
        node = f"n{draw(st.integers(0, n_nodes - 1)) if i else 0}"
        nodes.setdefault(node, []).append((t, 1))
    n_blocks = draw(st.integers(2, 12))
    base = [(draw(st.floats(0.1, 2.0)), draw(st.floats(0.1, 4.0))) for _ in range(n_blocks)]
    speed = {t: draw(st.floats(1.0, 4.0)) for t in TYPES}
    per_block = {t: [(f / speed[t], b / speed[t]) for f, b in base] for t in TYPES}
    output_bytes = draw(st.sampled_from([0.0, 1e7, 1e8]))
    params = draw(st.sampled_from([0, 10_000_000]))
    batch = draw(st.integers(1, 4))
    inter = draw(st.sampled_from(["1GB/s", "10GB/s", "100Gbps"]))
    return nodes, n_blocks, per_block, output_bytes, params, batch, inter


def _build(nodes, n_blocks, per_block, output_bytes, params, inter):
    profile = make_profile(
        n_blocks, per_block={t: v[:n_blocks] for t, v in per_block.items()}, output_bytes=output_bytes, params=params
    )
    merged = [(name, _merge(devices)) for name, devices in sorted(nodes.items())]
    cluster = make_cluster(merged, intra="50GB/s", inter=inter, inter_latency="10us")
    return profile, cluster


def _merge(devices: list[tuple[str, int]]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for t, c in devices:
        counts[t] = counts.get(t, 0) + c
    return list(counts.items())


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(instance=instances())
def test_planner_is_within_one_percent_of_exhaustive_search(instance) -> None:
    nodes, n_blocks, per_block, output_bytes, params, batch, inter = instance
    profile, cluster = _build(nodes, n_blocks, per_block, output_bytes, params, inter)
    while brute_force.space_size(cluster, n_blocks, batch) > SPACE_LIMIT and n_blocks > 2:
        n_blocks -= 1  # shrink the model until the brute force stays affordable
        profile, cluster = _build(nodes, n_blocks, per_block, output_bytes, params, inter)
    best_time, best = brute_force.best_plan(profile, cluster, batch)
    opts = PlanOptions(global_batch=batch, optimizer="sgd", micro_batch_sizes=(1,), baselines=False)
    planned = plan_training(profile, cluster, opts)
    assert simulate(planned.plan, profile, cluster).iteration_s == planned.sim.iteration_s
    assert planned.sim.iteration_s <= best_time * 1.01, (
        f"planner {planned.sim.iteration_s:.6g} vs exhaustive {best_time:.6g}\n"
        f"planner: {planned.plan.to_dict()['pipelines']}\nbest: {best.to_dict()['pipelines']}"
    )

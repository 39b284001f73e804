"""The memory walk's backward term against real gloo ranks: measured ÷ predicted peak, per rank.

    python benchmarks/bench_backward_workspace.py

Two one-device stages of an analytic GPT (4 layers, hidden 64, seq 128: the attention core's s²
tensors are most of a layer's activations), cut after block 5 or after block 3, unfused and fused
attention, 1F1B, two steps on gloo. Each rank's peak is measured at the CPU allocator
(``runtime/memtrack.py``), and predicted by the walk twice. "now": the backward of block k runs once
the blocks after it have freed what they kept (``simulate.memory.backward_extra``). "before": the
largest block's workspace beside everything the stage kept, the term until 2026-11-28.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hetplan.contracts import load_catalog
from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.profile.analytic import analytic_profile
from hetplan.runtime.launcher import launch_local
from hetplan.schedule.compile import compile_plan
from hetplan.simulate import memory

MODEL = {"layers": 4, "hidden": 64, "heads": 4, "seq": 128, "vocab": 256}
CATALOG_TYPE = "A100-40GB"  # the analytic profile's device type (its figures, not its speed, matter here)
NOW = memory.backward_extra


def _largest_beside_all(kept: list[float], work: list[float]) -> float:
    """The term before: the largest block's work, beside all the stage kept."""
    return max(work, default=0.0)


def _predicted(plan: Plan, profile, cluster, term) -> dict[str, float]:
    memory.backward_extra = term  # the module's global, which stage_terms reads
    memory._STATICS.clear()  # the walk keeps each stage's figures per profile: priced afresh by ``term``
    try:
        use = memory.plan_memory(
            compile_plan(plan, len(profile.blocks)), profile, cluster, optimizer=plan.optimizer, plan=plan
        )
    finally:
        memory.backward_extra = NOW
        memory._STATICS.clear()
    return {d: u.tensor_bytes for d, u in use.items()}


def main() -> None:
    os.environ.setdefault("HETPLAN_RANK_START", "forkserver")
    node = {"name": "n0", "devices": [{"type": "cpu", "count": 2}], "link": {"bandwidth": "600GB/s", "latency": 0}}
    cluster = parse_cluster(
        {"schema": "hetplan/cluster/v1", "name": "bench", "nodes": [node], "network": {"bandwidth": "100Gbps"}},
        file="bench",
    )
    print("| attention | cut after block | rank | measured | ÷ predicted now | ÷ predicted before |")
    print("|---|---|---|---|---|---|")
    for kernel in ("unfused", "fused"):
        for cut in (5, 3):
            config = {**MODEL, "attention": kernel}
            device = load_catalog().get(CATALOG_TYPE)
            profile = analytic_profile("gpt", config, devices=[device], micro_batches=(1, 2, 4))
            stages = (Stage(0, cut, ("n0/0",), (1.0,)), Stage(cut, len(profile.blocks), ("n0/1",), (1.0,)))
            plan = Plan(8, [Pipeline(8, (4, 4), stages)], optimizer="adam")
            with tempfile.TemporaryDirectory() as folder:
                path = Path(folder) / "rank-config.yaml"
                write_yaml(build_rank_config(plan, profile, cluster, seed=0, backend="gloo"), path)
                records = launch_local(path, steps=2).records
            measured = {r["device"]: r["peak_memory_bytes"] for r in records if r["peak_memory_bytes"] is not None}
            now = _predicted(plan, profile, cluster, NOW)
            before = _predicted(plan, profile, cluster, _largest_beside_all)
            for device in sorted(measured):
                peak = measured[device]
                print(
                    f"| {kernel} | {cut} | {device} | {peak / 2**20:.2f} MiB | {peak / now[device]:.3f} "
                    f"| {peak / before[device]:.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()

"""How fast the simulator times one iteration, and how that grows with devices and micro-batches.

    .venv/bin/python benchmarks/bench_simulate.py                  # the full table (about a minute)
    .venv/bin/python benchmarks/bench_simulate.py --quick          # 512 devices x 64 micro-batches only
    .venv/bin/python benchmarks/bench_simulate.py --profile        # cProfile of the largest case

Inputs: the bundled 512-GPU cluster ``profiles/clusters/scale-a100-v100.yaml`` (16 nodes of 8
A100-40GB, 48 nodes of 8 V100-16GB), a synthetic 48-block transformer-like profile with times for
both types, and plans of ``P`` pipelines x 8 stages (6 blocks each), ``M`` micro-batches of 2 samples
per pipeline, 1F1B, Adam. Two placements:

* ``node``: pipeline ``i`` is node ``i``, stage ``s`` its device ``s``: every activation transfer stays
  on NVLink (the realistic placement a planner picks);
* ``spread``: stage ``s`` of pipeline ``i`` is device ``s`` of node ``(i + s) mod P``: every transfer
  crosses the network and every node's NIC carries up to 8 flows at once (the worst case for the
  flow-sharing engine).

Each figure is the best of ``--repeat`` calls of :func:`hetplan.simulate.simulate` (compile,
build, run, statistics; no timeline), timed with ``time.perf_counter``.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetplan.contracts.cluster import Cluster, load_cluster  # noqa: E402
from hetplan.contracts.model_profile import Block, ModelProfile, Timing  # noqa: E402
from hetplan.contracts.plan import Pipeline, Plan, Stage  # noqa: E402
from hetplan.simulate import simulate  # noqa: E402

CLUSTER = ROOT / "profiles" / "clusters" / "scale-a100-v100.yaml"
N_BLOCKS, N_STAGES, MICRO_SIZE = 48, 8, 2
#: Seconds per block at micro-batch 1, 2, 4, 8 (forward; backward is twice): sub-linear at small
#: sizes, as GPUs are. V100 is 2.2x slower than A100 throughout.
A100_FWD = {1: 1.0e-3, 2: 1.6e-3, 4: 3.0e-3, 8: 5.8e-3}
V100_SLOWER = 2.2


def synthetic_profile() -> ModelProfile:
    """48 equal blocks (a GPT-like layer of hidden 1024, sequence 1024, fp16) timed on both types."""
    times = {
        "A100-40GB": {m: Timing(fwd=t, bwd=2 * t, source="estimated") for m, t in A100_FWD.items()},
        "V100-16GB": {
            m: Timing(fwd=t * V100_SLOWER, bwd=2 * t * V100_SLOWER, source="estimated") for m, t in A100_FWD.items()
        },
    }
    blocks = [
        Block(
            name=f"layer{i}",
            kind="transformer",
            params=12_600_000,
            param_bytes=2 * 12_600_000,
            activation_bytes=34 * 1024 * 1024,
            output_bytes=2 * 1024 * 1024,
            flops_fwd=2.6e10,
            times=times,
        )
        for i in range(N_BLOCKS)
    ]
    return ModelProfile(model={"name": "synthetic-48"}, dtype="fp16", blocks=blocks)


def make_plan(cluster: Cluster, n_pipelines: int, n_micro: int, placement: str) -> Plan:
    """``n_pipelines`` x 8 stages on the first ``n_pipelines`` nodes, placed as ``placement`` says."""
    per = N_BLOCKS // N_STAGES
    pipelines = []
    for i in range(n_pipelines):
        stages = []
        for s in range(N_STAGES):
            node = cluster.nodes[i if placement == "node" else (i + s) % n_pipelines]
            stages.append(Stage(s * per, (s + 1) * per, (node.devices[s].address,), (1.0,)))
        pipelines.append(Pipeline(n_micro * MICRO_SIZE, (MICRO_SIZE,) * n_micro, tuple(stages)))
    return Plan(global_batch=n_pipelines * n_micro * MICRO_SIZE, pipelines=pipelines, schedule="1f1b", optimizer="adam")


def best_of(repeat: int, plan: Plan, profile: ModelProfile, cluster: Cluster) -> tuple[float, int, float]:
    """(best seconds, tasks, predicted iteration seconds)."""
    best, result = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = simulate(plan, profile, cluster)
        best = min(best, time.perf_counter() - t0)
    assert result is not None
    return best, result.n_tasks, result.iteration_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="calls per case; the best is reported")
    parser.add_argument("--quick", action="store_true", help="only the 512-device, 64-micro-batch cases")
    parser.add_argument("--profile", action="store_true", help="cProfile the 512 x 64 case of each placement")
    args = parser.parse_args()

    cluster = load_cluster(CLUSTER)
    profile = synthetic_profile()
    if args.profile:
        for placement in ("node", "spread"):
            plan = make_plan(cluster, 64, 64, placement)
            simulate(plan, profile, cluster)  # warm
            prof = cProfile.Profile()
            prof.enable()
            simulate(plan, profile, cluster)
            prof.disable()
            print(f"--- placement {placement}")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
        return

    cases = [(512, 64)] if args.quick else [(d, 64) for d in (64, 128, 256, 512)] + [(512, m) for m in (8, 16, 32)]
    print(f"$ {shlex.join(['python', *sys.argv])}")
    print(
        f"cluster {CLUSTER.name}, {N_BLOCKS} blocks, {N_STAGES} stages per pipeline, micro-batches of "
        f"{MICRO_SIZE}, 1f1b, best of {args.repeat}"
    )
    header = (
        f"{'placement':<9} {'devices':>7} {'micro':>5} {'tasks':>8} {'simulate (s)':>12} {'us/task':>8} "
        f"{'iteration (ms)':>14}"
    )
    print(header)
    print("-" * len(header))
    for placement in ("node", "spread"):
        for devices, micro in cases:
            plan = make_plan(cluster, devices // N_STAGES, micro, placement)
            seconds, tasks, iteration = best_of(args.repeat, plan, profile, cluster)
            print(
                f"{placement:<9} {devices:>7} {micro:>5} {tasks:>8} {seconds:>12.3f} {seconds / tasks * 1e6:>8.2f} "
                f"{iteration * 1e3:>14.3f}"
            )


if __name__ == "__main__":
    main()

"""Each sync mode's peak memory per rank: what the runtime measured beside what the memory walk predicted.

    python benchmarks/bench_sync_memory.py                  # every mode, a few minutes on 2 shared cores
    python benchmarks/bench_sync_memory.py --modes wsp,sdpipe

The plans of ``tests/runtime/test_memory_terms.py::test_each_sync_modes_buffers_match_the_run``: the
zoo GPT (2 layers, hidden 128) measured block by block, two pipelines of two one-device stages, each
stage shared by the two pipelines, trained for 2 steps by real gloo ranks (plus the central process
under ``wsp`` and ``sdpipe``); each rank's peak of live tensor bytes on the second step (the torch
profiler's allocator records, planner/runtime/memtrack.py) beside the plan's predicted
``tensor_bytes`` (planner/simulate/memory.py, ``sync_buffers``). Prints a Markdown table and the command.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from builders import make_cluster  # noqa: E402

from hetplan.contracts.plan import Pipeline, Plan, Stage  # noqa: E402
from hetplan.contracts.yamlio import write_yaml  # noqa: E402
from hetplan.emit import build_rank_config  # noqa: E402
from hetplan.profile.measure import measure_profile  # noqa: E402
from hetplan.runtime.launcher import launch_local  # noqa: E402
from hetplan.schedule.compile import compile_plan  # noqa: E402
from hetplan.simulate.memory import plan_memory  # noqa: E402

MODEL = {"family": "gpt", "config": {"layers": 2, "hidden": 128, "heads": 4, "seq": 64, "vocab": 512}}
#: mode name -> the plan's optimizer, sync and sync_options
CASES = {
    "allreduce": {"optimizer": "adam", "sync": "allreduce"},
    "topk": {"optimizer": "adam", "sync": "topk", "sync_options": {"ratio": 0.01}},
    "adasum-sgd": {"optimizer": "sgd", "sync": "adasum"},
    "adasum-adam": {"optimizer": "adam", "sync": "adasum"},
    "wsp": {"optimizer": "adam", "sync": "wsp", "sync_options": {"staleness": 0, "wave": 1}},
    "wsp-wave": {"optimizer": "adam", "sync": "wsp", "sync_options": {"staleness": 0, "wave": 2}},
    "sdpipe": {"optimizer": "adam", "sync": "sdpipe"},
}


def _stage(start: int, end: int, device: str) -> Stage:
    return Stage(start, end, (device,), (1.0,))


def sync_plan(case: str) -> Plan:
    """Two pipelines of two one-device stages (blocks 0-2, 3-5) under ``case``'s sync mode."""
    pipelines = [Pipeline(4, (2, 2), (_stage(0, 3, f"n0/{2 * p}"), _stage(3, 6, f"n0/{2 * p + 1}"))) for p in range(2)]
    return Plan(8, pipelines, **CASES[case])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    args = parser.parse_args()
    profile = measure_profile(MODEL, micro_batches=(1, 2), warmup=1, repeat=1)
    cluster = make_cluster([("n0", [("cpu", 4)])])
    print("| mode | device | measured (MB) | predicted (MB) | measured / predicted |")
    print("|---|---|---|---|---|")
    for case in args.modes.split(","):
        plan = sync_plan(case)
        with tempfile.TemporaryDirectory() as folder:
            config = Path(folder) / "rank-config.yaml"
            write_yaml(build_rank_config(plan, profile, cluster, seed=0, backend="gloo"), config)
            records = launch_local(config, steps=2).records
        predicted = plan_memory(
            compile_plan(plan, len(profile.blocks)), profile, cluster, optimizer=plan.optimizer, plan=plan
        )
        measured = {r["device"]: r["peak_memory_bytes"] for r in records if r["peak_memory_bytes"] is not None}
        for device in sorted(measured):
            want = predicted[device].tensor_bytes
            print(
                f"| {case} | {device} | {measured[device] / 1e6:.2f} | {want / 1e6:.2f} | "
                f"{measured[device] / want:.3f} |",
                flush=True,
            )
    print(f"\n`python {shlex.join(['benchmarks/bench_sync_memory.py', *sys.argv[1:]])}`")


if __name__ == "__main__":
    main()

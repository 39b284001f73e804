"""Peak memory per rank: what the runtime measured beside what the memory walk predicted.

    python benchmarks/bench_memory.py                 # about a minute on 2 shared cores

The zoo GPT is measured here block by block (saved activations, outputs, parameters:
:func:`measure_profile`), a few plans are written (1F1B and GPipe, a replicated stage, pipelines cut
differently, fp32 and bf16), each is trained for 2 steps by real gloo ranks on this machine
(:func:`launch_local`), and each rank's peak of live tensor bytes (the torch profiler's allocator
records on the second step, planner/runtime/memtrack.py) is put beside the plan's predicted
``tensor_bytes`` (planner/simulate/memory.py). Prints a Markdown table and the command.
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


def _stage(start: int, end: int, *devices: str, shares: tuple[float, ...] | None = None) -> Stage:
    return Stage(start, end, devices, shares or tuple(1.0 / len(devices) for _ in devices))


def plans(n: int) -> dict[str, Plan]:
    """Hand-written plans over the model's ``n`` blocks on up to 4 devices."""
    half, third = n // 2, n // 3
    return {
        "1F1B, 2 stages, adam": Plan(
            16, [Pipeline(16, (4, 4, 4, 4), (_stage(0, half, "n0/0"), _stage(half, n, "n0/1")))], optimizer="adam"
        ),
        "GPipe, 3 stages, adam": Plan(
            16,
            [
                Pipeline(
                    16,
                    (4,) * 4,
                    (_stage(0, third, "n0/0"), _stage(third, 2 * third, "n0/1"), _stage(2 * third, n, "n0/2")),
                )
            ],
            schedule="gpipe",
            optimizer="adam",
        ),
        "1F1B, replicated stage 0 (2 x 0.5), momentum": Plan(
            16,
            [Pipeline(16, (8, 8), (_stage(0, half, "n0/0", "n0/1"), _stage(half, n, "n0/2")))],
            optimizer="momentum",
        ),
        "1F1B, 2 pipelines cut differently, sgd": Plan(
            16,
            [
                Pipeline(10, (2, 4, 4), (_stage(0, third, "n0/0"), _stage(third, n, "n0/1"))),
                Pipeline(6, (3, 3), (_stage(0, 2 * third, "n0/2"), _stage(2 * third, n, "n0/3"))),
            ],
            optimizer="sgd",
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    args = parser.parse_args()
    model = {
        "family": "gpt",
        "config": {"layers": args.layers, "hidden": args.hidden, "heads": 4, "seq": args.seq, "vocab": args.vocab},
    }
    cluster = make_cluster([("n0", [("cpu", 4)])])
    print(f"`{shlex.join(['python', *sys.argv])}`\n")
    print("| dtype | plan | rank (device) | measured | predicted | error |")
    print("|---|---|---|---:|---:|---:|")
    worst = 0.0
    for dtype in args.dtypes:
        profile = measure_profile(model, micro_batches=(1, 2, 4, 8), warmup=1, repeat=1, dtype=dtype)
        for name, plan in plans(len(profile.blocks)).items():
            plan.dtype = dtype
            work = Path(tempfile.mkdtemp(prefix="bench-memory-"))
            config = build_rank_config(plan, profile, cluster, seed=0, backend="gloo")
            write_yaml(config, work / "rank-config.yaml")
            records = launch_local(work / "rank-config.yaml", steps=2).records
            predicted = plan_memory(compile_plan(plan, len(profile.blocks)), profile, cluster, optimizer=plan.optimizer)
            for r in sorted(records, key=lambda r: r["rank"]):
                if r["peak_memory_bytes"] is None:
                    continue
                want = predicted[r["device"]].tensor_bytes
                error = r["peak_memory_bytes"] / want - 1
                worst = max(worst, abs(error))
                print(
                    f"| {dtype} | {name} | {r['rank']} ({r['device']}) | {r['peak_memory_bytes'] / 2**20:.2f} MiB "
                    f"| {want / 2**20:.2f} MiB | {error:+.1%} |"
                )
    print(f"\nlargest |error|: {worst:.1%}")


if __name__ == "__main__":
    main()

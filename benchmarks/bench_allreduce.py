"""What the asynchronous, hook-issued all-reduce changed: measured throughput beside the old blocking one.

    python benchmarks/bench_allreduce.py              # about 2 minutes on 2 shared cores

Before the schedule contract of issue 9, a rank ran each gradient all-reduce at its ``AR`` action,
after its last backward, and waited there; now each is issued from gradient hooks the moment its
group's gradients are final and waited on at ``OPT`` (docs/runtime.md). The runtime keeps the old
behaviour behind ``launch_local(..., blocking_allreduce=True)`` for this comparison only.

For each plan (the zoo GPT measured here; plans whose devices share gradient groups, so there are
all-reduces to move), the two variants are trained alternately (blocking, async, blocking, ...) so
both see the same background load, ``--rounds`` runs each of ``--steps`` steps; the first
``--warmup`` steps of every run are left out; per step the slowest rank's iteration time; samples/s
= global batch / median. Prints a Markdown table and the command.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetplan.contracts.cluster import load_cluster  # noqa: E402
from hetplan.contracts.plan import Pipeline, Plan, Stage  # noqa: E402
from hetplan.contracts.yamlio import write_yaml  # noqa: E402
from hetplan.emit import build_rank_config  # noqa: E402
from hetplan.profile.measure import measure_profile  # noqa: E402
from hetplan.runtime.launcher import launch_local  # noqa: E402

CLUSTERS = ROOT / "profiles" / "clusters"


def _stage(start: int, end: int, *devices: str) -> Stage:
    return Stage(start, end, devices, tuple(1.0 / len(devices) for _ in devices))


def cases(n: int, batch: int) -> list[tuple[str, str, Plan]]:
    """(cluster, description, plan): data parallel on local-2; pipelines cut differently on local-4."""
    half, q = batch // 2, n // 4
    return [
        (
            "local-2",
            "2 pipelines x 1 stage (data parallel), equal shares",
            Plan(batch, [Pipeline(half, (half // 4,) * 4, (_stage(0, n, f"local/{i}"),)) for i in range(2)]),
        ),
        (
            "local-4",
            "2 pipelines x 2 stages, cut differently (3 gradient groups)",
            Plan(
                batch,
                [
                    Pipeline(half, (half // 4,) * 4, (_stage(0, q, "local/0"), _stage(q, n, "local/2"))),
                    Pipeline(half, (half // 4,) * 4, (_stage(0, 3 * q, "local/1"), _stage(3 * q, n, "local/3"))),
                ],
            ),
        ),
    ]


def run(config: Path, *, steps: int, warmup: int, blocking: bool) -> list[float]:
    records = launch_local(config, steps=steps, emulate=True, blocking_allreduce=blocking).records
    per_step: dict[int, float] = {}
    for r in records:
        per_step[r["step"]] = max(per_step.get(r["step"], 0.0), r["iteration_s"])
    return [t for s, t in sorted(per_step.items()) if s >= warmup]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = {
        "family": "gpt",
        "config": {"layers": args.layers, "hidden": args.hidden, "heads": 4, "seq": 64, "vocab": 512},
    }
    profile = measure_profile(model, micro_batches=(1, 2, 4, 8), warmup=1, repeat=3)
    print(f"`{shlex.join(['python', *sys.argv])}`\n")
    print("| cluster | plan | blocking all-reduce | async all-reduce | async / blocking (samples/s) |")
    print("|---|---|---:|---:|---:|")
    for cluster_name, description, plan in cases(len(profile.blocks), args.batch):
        cluster = load_cluster(CLUSTERS / f"{cluster_name}.yaml")
        work = Path(tempfile.mkdtemp(prefix="bench-allreduce-"))
        config = build_rank_config(plan, profile, cluster, seed=0, backend="gloo")
        write_yaml(config, work / "rank-config.yaml")
        times: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.rounds):
            for blocking in (True, False):
                times[blocking] += run(
                    work / "rank-config.yaml", steps=args.steps, warmup=args.warmup, blocking=blocking
                )
        old, new = statistics.median(times[True]), statistics.median(times[False])
        print(
            f"| {cluster_name} (emulated) | {description} | {args.batch / old:.1f} samples/s ({old * 1e3:.0f} ms) "
            f"| {args.batch / new:.1f} samples/s ({new * 1e3:.0f} ms) | {old / new:.3f}x |"
        )


if __name__ == "__main__":
    main()

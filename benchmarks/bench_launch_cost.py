"""What a local launch costs, ranks forked (``HETPLAN_RANK_START=forkserver``) beside ranks spawned.

    python benchmarks/bench_launch_cost.py [--launches 4] [--steps 3]

Each way runs in a child process of its own that launches a two-stage, two-rank zoo GPT (2 layers,
hidden 32) ``--launches`` times for ``--steps`` steps, one launch after another, as the test suite
does. This script is a child subreaper, so every process of those launches (agent, fork
servers, resource trackers, ranks: some outlive their parents) is reaped here and its CPU counted;
the table gives each way's wall time per launch, the time of its first step, the CPU of
the whole child (its own imports included) and, from a second child that launches once, the CPU of
each launch after the first: (CPU of N launches - CPU of 1) / (N - 1).
Prints a Markdown table (docs/runtime.md, "How ranks start", quotes it) and the load average.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PR_SET_CHILD_SUBREAPER = 36


def _launches(folder: Path, launches: int, steps: int) -> None:
    """The child: ``launches`` launches of the two-stage GPT; one JSON line of timings."""
    sys.path.insert(0, str(ROOT / "tests"))
    from builders import make_cluster, zoo_profile

    from hetplan.contracts.plan import Pipeline, Plan, Stage
    from hetplan.contracts.yamlio import write_yaml
    from hetplan.emit import build_rank_config
    from hetplan.runtime.launcher import launch_local

    profile = zoo_profile({"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}})
    plan = Plan(
        global_batch=8,
        pipelines=[Pipeline(8, (4, 4), (Stage(0, 3, ("n0/0",), (1.0,)), Stage(3, 6, ("n0/1",), (1.0,))))],
    )
    cluster = make_cluster([("n0", [("cpu", 2)])])
    config = folder / "rank-config.yaml"
    write_yaml(build_rank_config(plan, profile, cluster, seed=7, timeout_s=60), config)
    walls, firsts = [], []
    for i in range(launches):
        start = time.perf_counter()
        first: list[float] = []
        launch_local(config, steps=steps, run_dir=folder / f"run{i}", on_step=_stamp(first))
        walls.append(time.perf_counter() - start)
        firsts.append(first[0] - start if first else float("nan"))
    print(json.dumps({"wall": walls, "first_step": firsts}))


def _stamp(into: list[float]):
    """A step callback that records when each step line was seen."""
    return lambda _line: into.append(time.perf_counter())


def _run_child(way: str, launches: int, steps: int) -> tuple[dict, float]:
    """Timings of one child and the CPU of everything it started (this process is the subreaper:
    each of its descendants, orphaned or not, ends up reaped here, its CPU counted)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, HETPLAN_RANK_START=way, PYTHONPATH=str(ROOT))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            [sys.executable, __file__, "--child", "run", "--folder", tmp, "--launches", str(launches),
             "--steps", str(steps)],
            env=env, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        while True:
            try:
                os.wait()
            except ChildProcessError:
                break
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(out.strip().splitlines()[-1]), cpu


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench_launch_cost.py")
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--child", choices=["run"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _launches(Path(args.folder), args.launches, args.steps)
        return
    print(f"(load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} before)\n")
    print(
        "| ranks started by | launches | wall per launch | first step after | CPU, whole child "
        "| CPU per launch after the first |"
    )
    print("|---|---|---|---|---|---|")
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    for way in ("spawn", "forkserver"):
        _, one = _run_child(way, 1, args.steps)
        got, cpu = _run_child(way, args.launches, args.steps)
        walls = ", ".join(f"{w:.2f}" for w in got["wall"])
        firsts = ", ".join(f"{f:.2f}" for f in got["first_step"])
        later = (cpu - one) / (args.launches - 1) if args.launches > 1 else float("nan")
        whole = f"{cpu:.1f} s (1 launch: {one:.1f} s)"
        print(f"| {way} | {args.launches} | {walls} s | {firsts} s | {whole} | {later:.1f} s |")
    print(f"\n(load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} after)")
    print(f"\n`python benchmarks/bench_launch_cost.py --launches {args.launches} --steps {args.steps}`")


if __name__ == "__main__":
    main()

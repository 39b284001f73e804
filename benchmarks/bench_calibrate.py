"""Calibration end to end on the emulated cluster local-2: does one measured run predict another plan?

    python benchmarks/bench_calibrate.py            # about 2 minutes on 2 shared cores
    python benchmarks/bench_calibrate.py --steps 10 --batch 32 --keep bench-calibrate/

1. profile the zoo GPT of ``hetplan demo`` here, block by block (torch, one thread: what each rank gets);
2. plan it for ``profiles/clusters/local-2.yaml`` (a full-speed and a 3x-slowed emulated CPU rank):
   plan A is the planner's plan; the plans to predict are the uniform baseline of the same search
   (where it differs from A) and a two-stage pipeline cut where the profile balances the stages;
3. ``hetplan launch A --steps N --emulate --log run-a.jsonl`` (the real command, in a subprocess);
4. calibrate the profile and cluster from that one run log (``hetplan calibrate``'s function);
5. predict the other plans with the input and the calibrated files, then launch each the same way;
6. print measured beside predicted (before and after calibration) for every plan, and the command.

Every figure is a real run on this machine: one process per rank, gloo over loopback. The speeds
are EMULATED (local-2's slow rank sleeps twice its compute time), and a 2-core box shared with
other work is noisy: each run prints the load average it ran under.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hetplan.calibrate import calibrate_files  # noqa: E402
from hetplan.calibrate.inputs import load_observations  # noqa: E402
from hetplan.contracts.cluster import Cluster, load_cluster  # noqa: E402
from hetplan.contracts.measurements import MeasuredRun, Measurements  # noqa: E402
from hetplan.contracts.model_profile import ModelProfile, load_profile  # noqa: E402
from hetplan.contracts.plan import Pipeline, Plan, Stage, load_plan  # noqa: E402
from hetplan.contracts.yamlio import sha256_of, write_yaml  # noqa: E402
from hetplan.demo import DEMO_MODEL  # noqa: E402
from hetplan.simulate import simulate  # noqa: E402
from hetplan.solve import PlanOptions, finalize_plan, plan_training  # noqa: E402

CLUSTER = ROOT / "profiles" / "clusters" / "local-2.yaml"
MICRO_SIZES = (1, 2, 4, 8)


def load_text() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def stages(plan: Plan, cluster: Cluster) -> str:
    """``cpu-fast[0:7] > cpu-slow[7:10], 4x8``: each pipeline's stages (type[blocks]) and micro-batches."""
    types = {d.address: d.type.name for d in cluster.devices}
    parts = []
    for p in plan.pipelines:
        chain = " > ".join(f"{'+'.join(types[d] for d in s.devices)}[{s.start}:{s.end}]" for s in p.stages)
        sizes = sorted(set(p.micro_batches))
        micro = "+".join(str(m) for m in p.micro_batches) if len(sizes) > 1 else f"{len(p.micro_batches)}x{sizes[0]}"
        parts.append(f"{chain}, {micro}")
    return "; ".join(parts)


def measure(work: Path, repeat: int) -> Path:
    import torch

    from hetplan.profile.measure import measure_profile

    torch.set_num_threads(1)
    profile = measure_profile(DEMO_MODEL, micro_batches=MICRO_SIZES, device="cpu", warmup=2, repeat=repeat)
    path = work / "gpt.profile.yaml"
    profile.save(path)
    return path


def _save(plan: Plan, path: Path, profile_path: Path, profile: ModelProfile, cluster: Cluster) -> Path:
    """Write ``plan`` as a plan file ``hetplan launch`` takes (inputs with their sha256, predictions)."""
    plan.inputs = {
        "profile": {"path": os.path.relpath(profile_path, path.parent), "sha256": sha256_of(profile_path)},
        "cluster": {"path": os.path.relpath(CLUSTER, path.parent), "sha256": sha256_of(CLUSTER)},
    }
    plan.dtype = profile.dtype
    plan.predicted = simulate(plan, profile, cluster).predicted()
    plan.save(path)
    return path


def _shape(plan: Plan) -> list:
    return [(p.batch, p.micro_batches, [(s.start, s.end, s.devices) for s in p.stages]) for p in plan.pipelines]


def pipeline_plan(profile: ModelProfile, cluster: Cluster, batch: int, micro: int) -> Plan:
    """One pipeline, cpu-fast then cpu-slow, cut where the two stages' compute is closest to equal
    (by the profile: what a user splitting by hand would do); ``batch / micro`` micro-batches, 1F1B."""
    fast, slow = cluster.devices[0], cluster.devices[1]
    n = len(profile.blocks)

    def seconds(device, lo: int, hi: int) -> float:
        return sum(sum(profile.block_time(b, device.type, micro)) for b in range(lo, hi))

    cut = min(range(1, n), key=lambda c: (max(seconds(fast, 0, c), seconds(slow, c, n)), c))
    stages = (Stage(0, cut, (fast.address,), (1.0,)), Stage(cut, n, (slow.address,), (1.0,)))
    return Plan(global_batch=batch, pipelines=[Pipeline(batch, (micro,) * (batch // micro), stages)])


def make_plans(profile_path: Path, work: Path, batch: int) -> list[tuple[str, Path]]:
    """Plan A (the planner's), then the plans to predict: the uniform baseline of the same search
    where it differs from A, and a two-stage pipeline (a different structure: point-to-point
    transfers A never made, other blocks on each rank)."""
    profile, cluster = load_profile(profile_path), load_cluster(CLUSTER)
    result = plan_training(profile, cluster, PlanOptions(global_batch=batch, micro_batch_sizes=MICRO_SIZES))
    path_a = work / "plan-a.yaml"
    finalize_plan(
        result, profile_path=profile_path, cluster_path=CLUSTER, output=path_a, cluster=cluster, dtype=profile.dtype
    ).save(path_a)
    out = [("A: hetplan's plan (fitted on)", path_a)]
    uniform = result.baselines.get("uniform")
    if uniform is not None and uniform.sim is not None and _shape(uniform.plan) != _shape(result.plan):
        out.append(("B: uniform baseline", _save(uniform.plan, work / "plan-b.yaml", profile_path, profile, cluster)))
    pipeline = pipeline_plan(profile, cluster, batch, max(MICRO_SIZES))
    out.append(("C: 2-stage pipeline", _save(pipeline, work / "plan-c.yaml", profile_path, profile, cluster)))
    return out


def launch(plan: Path, log: Path, steps: int) -> tuple[str, float]:
    """``hetplan launch PLAN --steps N --emulate --log LOG`` in a subprocess; returns the command and seconds."""
    command = [sys.executable, str(ROOT / "cli.py"), "launch", str(plan), "--steps", str(steps), "--emulate"]
    command += ["--log", str(log)]
    started = time.time()
    for attempt in (1, 2):  # a shared box: another job's launch can take the rendezvous port
        done = subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode == 0:
            break
        print(f"launch failed (attempt {attempt}): {done.stderr.strip()}")
        if attempt == 2:
            raise SystemExit(done.returncode)
    return shlex.join(["hetplan", *command[2:]]), time.time() - started


def measured_iteration(plan: Path, log: Path, profile: ModelProfile, cluster: Cluster) -> float:
    """The run's iteration time as calibrate reads it (median over the steps after the first)."""
    runs = [MeasuredRun(index=0, name=log.name, plan=plan, run_log=log)]
    return load_observations(Measurements(runs=runs), profile, cluster)[0].iteration_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10, help="training steps per launch")
    parser.add_argument("--batch", type=int, default=32, help="global batch")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per block and size when profiling")
    parser.add_argument("--keep", type=Path, default=None, help="keep every file in this folder")
    parser.add_argument("--profile", type=Path, default=None, help="use this profile instead of measuring one")
    args = parser.parse_args()
    started = time.time()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="hetplan-bench-calibrate-"))
    print(f"$ python benchmarks/bench_calibrate.py {' '.join(sys.argv[1:])}".rstrip())
    print(f"start: {load_text()}")

    profile_path = args.profile.resolve() if args.profile else measure(work, args.repeat)
    plans = make_plans(profile_path, work, args.batch)
    profile, cluster = load_profile(profile_path), load_cluster(CLUSTER)

    logs = []
    for k, (_, path) in enumerate(plans):
        log = work / f"run-{path.stem.split('-')[-1]}.jsonl"
        command, wall = launch(path, log, args.steps)
        print(f"ran: {command} ({wall:.0f} s; {load_text()})")
        logs.append(log)
        if k == 0:  # calibrate from plan A's run alone, before the others run
            write_yaml(
                {"schema": "hetplan/measurements/v1", "runs": [{"plan": path.name, "run_log": log.name}]},
                work / "measured.yaml",
            )
            result, (cal_profile_path, cal_cluster_path) = calibrate_files(
                profile_path, CLUSTER, work / "measured.yaml", work / "calibrated"
            )
            print(f"ran: hetplan calibrate {profile_path.name} {CLUSTER.name} measured.yaml -o calibrated/")
    cal_profile, cal_cluster = load_profile(cal_profile_path), load_cluster(cal_cluster_path)

    print(
        f"\n### Calibration on local-2 (EMULATED devices): fitted on plan A's run alone, predicting the others "
        f"(global batch {args.batch}, {args.steps} steps per run, the first left out)\n"
    )
    print(
        "| plan | pipelines: stages type[blocks], micro-batches | measured (ms) | predicted before (ms) | error | "
        "predicted after (ms) | error |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for (label, path), log in zip(plans, logs, strict=True):
        plan = load_plan(path)
        measured = measured_iteration(path, log, profile, cluster)
        before = simulate(plan, profile, cluster).iteration_s
        after = simulate(plan, cal_profile, cal_cluster).iteration_s
        print(
            f"| {label} | {stages(plan, cluster)} | {measured * 1e3:.1f} | {before * 1e3:.1f} | "
            f"{before / measured - 1:+.1%} | {after * 1e3:.1f} | {after / measured - 1:+.1%} |"
        )
    print(
        "\nerror = predicted / measured - 1; measured: median over the steps after the first of the slowest rank's"
        " step."
    )
    print("\nFitted on plan A's run:\n")
    print("| parameter | input | calibrated | status |")
    print("|---|---:|---:|---|")
    for p in result.params:
        status = "identified" if p.identified else f"prior: {p.reason}"
        print(f"| {p.name} | {p.prior:.6g} | {p.value:.6g} | {status} |")
    print(f"\n{time.time() - started:.0f} s in all; at the end: {load_text()}; files in {work}")


if __name__ == "__main__":
    main()

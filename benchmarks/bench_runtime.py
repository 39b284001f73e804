"""Runtime benchmarks: real training runs of hetplan's plans, measured beside predictions and torch.

    python benchmarks/bench_runtime.py throughput   # hetplan's plan vs the uniform split, emulated clusters
    python benchmarks/bench_runtime.py accuracy     # the same runs: predicted vs measured iteration time
    python benchmarks/bench_runtime.py pipelining   # hetplan runtime vs torch.distributed.pipelining 1F1B
    python benchmarks/bench_runtime.py all          # everything (about 4 minutes on 2 shared cores)

Prints Markdown tables (docs/benchmarks.md quotes them) and the command that made them. Every figure
comes from a real run on this machine: one process per rank, gloo over loopback, one thread per rank.

* **throughput**: the zoo GPT is measured here (:func:`measure_profile`, one thread, as each rank runs),
  planned for the emulated clusters ``local-4`` (2 cpu-fast + 2 cpu-slow at 2x, 4 ranks on however
  many cores there are) and ``local-2`` (1 cpu-fast + 1 cpu-slow at 3x, one rank per core of a
  2-core machine); hetplan's plan and the ``uniform`` baseline of the same planning run are each
  trained by :func:`launch_local` with ``emulate=True``. The runs alternate (hetplan, uniform,
  hetplan, uniform, ...) so that both see the same background load. Per step the iteration time is
  the slowest rank's (each rank times its whole step, the final loss all-reduce included: a
  synchronisation point); the first ``--warmup`` steps of every run are left out, the rest pooled
  over the rounds; samples/s = global batch / median iteration time.
* **accuracy**: the simulator's iteration time for each of those plans (from the profile measured
  alone, and from a *contended* profile measured while one background process per other rank of the
  run trains the same model, each as that rank's emulated type would: compute, then sleep) beside
  the measured median.
* **pipelining**: one pipeline of 2 stages (the same blocks split at the same cut, the same 1F1B
  schedule, micro-batches, global batch, data, Adam and learning rate) run by hetplan's runtime
  (``launch_local``, no emulation) and by ``torch.distributed.pipelining`` (``PipelineStage`` +
  ``Schedule1F1B``, written below), 2 processes each. Both time each step inside the workers
  (process start-up excluded) the same way: from the step's start to the end of a loss all-reduce
  after the optimizer step. Losses are compared too: both sides compute the same gradients.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from hetplan.contracts.cluster import Cluster, load_cluster  # noqa: E402
from hetplan.contracts.model_profile import ModelProfile  # noqa: E402
from hetplan.contracts.plan import Pipeline, Plan, Stage  # noqa: E402
from hetplan.contracts.yamlio import write_yaml  # noqa: E402
from hetplan.emit import build_rank_config  # noqa: E402
from hetplan.emit.rank_config import DEFAULT_LR  # noqa: E402
from hetplan.models import resolve_model  # noqa: E402
from hetplan.profile.measure import measure_profile  # noqa: E402
from hetplan.runtime.launcher import launch_local  # noqa: E402
from hetplan.simulate import simulate  # noqa: E402
from hetplan.solve import PlanOptions, plan_training  # noqa: E402
from hetplan.solve.baselines import balanced_cuts  # noqa: E402

CLUSTERS = ROOT / "profiles" / "clusters"
MICRO_SIZES = (1, 2, 4, 8, 16)
SEED = 0


def gpt_model(args: argparse.Namespace) -> dict:
    return {
        "family": "gpt",
        "config": {"layers": args.layers, "hidden": args.hidden, "heads": 4, "seq": args.seq, "vocab": args.vocab},
    }


def load_text() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min)"


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f}"


# --------------------------------------------------------------------------- profiles
def measure(model: dict, repeat: int) -> ModelProfile:
    """The model measured here, block by block, with one thread (as every rank runs)."""
    torch.set_num_threads(1)
    return measure_profile(model, micro_batches=MICRO_SIZES, device="cpu", warmup=2, repeat=repeat)


def load_worker(model: dict, slowdown: float) -> None:
    """A background load that behaves like one more rank: train the model on one thread, forever
    (killed by the parent), sleeping ``(slowdown - 1) x`` each pass as an emulated slow rank does."""
    torch.set_num_threads(1)
    zoo = resolve_model(model)
    blocks = zoo.build_blocks(0, zoo.n_blocks, SEED)
    x, y = zoo.sample_batch(8, seed=SEED, step=0)
    print("ready", flush=True)
    while True:
        t0 = time.perf_counter()
        h = x
        for b in blocks:
            h = b(h)
        zoo.loss(h, y).backward()
        if slowdown > 1.0:
            time.sleep((time.perf_counter() - t0) * (slowdown - 1.0))


def measure_contended(model: dict, repeat: int, others: list[float]) -> ModelProfile:
    """The profile measured while one background process per other rank of the run computes beside it.

    ``others``: the emulated slowdown of each other rank. During a run every rank competes for the
    cores with the others (and an emulated slow rank leaves its core while it sleeps); this measures
    each block under the same competition, the measuring process playing a full-speed rank.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "_load", "--model", json.dumps(model), "--slowdown", str(slowdown)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for slowdown in others
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            p.stdout.readline()  # "ready": built its blocks, now computing
        time.sleep(0.5)
        return measure(model, repeat)
    finally:
        for p in procs:
            p.kill()
            p.wait()


# --------------------------------------------------------------------------- runs of hetplan plans
@dataclass
class Runs:
    """Per-step iteration times (slowest rank) pooled over rounds, warm-up steps left out."""

    steps: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)  # last step's loss, per run
    run_medians: list[float] = field(default_factory=list)  # each run's median step, in run order
    compute: list[float] = field(default_factory=list)  # per kept step, the busiest rank's compute_s

    @property
    def median(self) -> float:
        return _median(self.steps)

    @property
    def best(self) -> float:
        return min(self.steps) if self.steps else float("nan")


def run_plan(config_path: Path, *, steps: int, warmup: int, emulate: bool, into: Runs) -> None:
    result = launch_local(config_path, steps=steps, emulate=emulate, threads=1)
    per_step: dict[int, float] = {}
    compute: dict[int, float] = {}
    last_loss: dict[int, float] = {}
    for r in result.records:
        per_step[r["step"]] = max(per_step.get(r["step"], 0.0), r["iteration_s"])
        compute[r["step"]] = max(compute.get(r["step"], 0.0), r["compute_s"])
        last_loss[r["step"]] = r["loss"]
    kept = [t for s, t in sorted(per_step.items()) if s >= warmup]
    into.compute += [t for s, t in sorted(compute.items()) if s >= warmup]
    into.steps += kept
    into.run_medians.append(_median(kept))
    into.losses.append(last_loss[max(last_loss)])


def paired(base: Runs, other: Runs) -> str:
    """Round by round (the two ran back to back): base's median step / other's."""
    return ", ".join(f"{b / o:.2f}x" for b, o in zip(base.run_medians, other.run_medians, strict=True))


def describe(plan: Plan, cluster: Cluster) -> str:
    """``cpu-fast[0:10], 21 samples as 5 + 2x8; ...``: each pipeline's stages (type[blocks]), share, micro-batches."""
    types = {d.address: d.type.name for d in cluster.devices}
    parts = []
    for p in plan.pipelines:
        stages = " > ".join(f"{'+'.join(types[d] for d in s.devices)}[{s.start}:{s.end}]" for s in p.stages)
        groups: list[list[int]] = []  # runs of equal micro-batch sizes: [5, 8, 8] -> "5 + 2x8"
        for m in p.micro_batches:
            if groups and groups[-1][0] == m:
                groups[-1][1] += 1
            else:
                groups.append([m, 1])
        micro = " + ".join(f"{k}x{m}" if k > 1 else str(m) for m, k in groups)
        parts.append(f"{stages}, {p.batch} samples as {micro}")
    return "; ".join(parts)


@dataclass
class ClusterCase:
    name: str
    cluster: Cluster
    plans: dict[str, Plan]
    predicted: dict[str, float]
    predicted_compute: dict[str, float]  # the busiest stage's forward + backward, summed over micro-batches
    runs: dict[str, Runs]
    contended: dict[str, float] = field(default_factory=dict)


def throughput_runs(args: argparse.Namespace, profile: ModelProfile, work: Path) -> list[ClusterCase]:
    cases = []
    for name in args.clusters:
        cluster = load_cluster(CLUSTERS / f"{name}.yaml")
        result = plan_training(profile, cluster, PlanOptions(global_batch=args.batch, micro_batch_sizes=MICRO_SIZES))
        uniform = result.baselines.get("uniform")
        plans = {"hetplan": result.plan}
        sims = {"hetplan": result.sim}
        if uniform is not None and uniform.sim is not None:
            plans["uniform"] = uniform.plan
            sims["uniform"] = uniform.sim
        predicted = {k: sim.iteration_s for k, sim in sims.items()}
        busiest = {k: max(st.fwd_s + st.bwd_s for st in sim.stages) for k, sim in sims.items()}
        runs = {k: Runs() for k in plans}
        paths = {}
        for key, plan in plans.items():
            paths[key] = work / f"{name}-{key}.yaml"
            write_yaml(build_rank_config(plan, profile, cluster, seed=SEED), paths[key])
        for _ in range(args.rounds):
            for key in plans:
                run_plan(paths[key], steps=args.steps, warmup=args.warmup, emulate=True, into=runs[key])
        cases.append(ClusterCase(name, cluster, plans, predicted, busiest, runs))
    return cases


def print_throughput(cases: list[ClusterCase], args: argparse.Namespace) -> None:
    print(
        f"\n### Throughput: hetplan's plan vs the uniform split (emulated devices, global batch {args.batch}, "
        f"{args.rounds} runs x {args.steps} steps each, first {args.warmup} of each run left out)\n"
    )
    print(
        "| cluster | plan | pipelines: stages type[blocks], samples as micro-batches | median iteration (ms) "
        "| best (ms) | samples/s | speedup |"
    )
    print("|---|---|---|---:|---:|---:|---:|")
    for c in cases:
        base = c.runs["uniform"].median if "uniform" in c.runs else None
        for key, plan in c.plans.items():
            r = c.runs[key]
            speed = f"**{base / r.median:.2f}x**" if base and key == "hetplan" else ("1.00x" if base else "-")
            print(
                f"| {c.name} | {key} | {describe(plan, c.cluster)} | {_ms(r.median)} | {_ms(r.best)} | "
                f"{args.batch / r.median:.1f} | {speed} |"
            )
    print()
    for c in cases:
        if "uniform" in c.runs:
            pairs = paired(c.runs["uniform"], c.runs["hetplan"])
            print(f"{c.name}: speedup run by run (each pair back to back): {pairs}  ")
    print(
        "\nIteration: per step the slowest rank's time (each rank times its whole step, loss all-reduce included); "
        "median and best over the kept steps of all runs; samples/s = global batch / median; speedup = uniform's "
        "median / hetplan's."
    )


def print_accuracy(cases: list[ClusterCase], args: argparse.Namespace) -> None:
    print("\n### Accuracy: the simulator's iteration time vs the measured median (the runs above)\n")
    print(
        "| cluster | plan | measured median (ms) | predicted, profile alone (ms) | error | predicted, contended "
        "profile (ms) | error | busiest rank's compute: measured / predicted (ms) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for c in cases:
        for key in c.plans:
            m = c.runs[key].median
            p = c.predicted[key]
            q = c.contended.get(key)
            contended = f"{_ms(q)} | {m / q - 1:+.0%}" if q else "- | -"
            mc, pc = _median(c.runs[key].compute), c.predicted_compute[key]
            compute = f"{_ms(mc)} / {_ms(pc)} ({mc / pc - 1:+.0%})"
            print(f"| {c.name} | {key} | {_ms(m)} | {_ms(p)} | {m / p - 1:+.0%} | {contended} | {compute} |")
    print(
        "\nerror = measured / predicted - 1. Contended profile: measured while one background process per other "
        "rank trained the same model on one thread, each emulating that rank's type as the runtime does (compute, "
        "then sleep (slowdown - 1) x), the measuring process playing the fastest rank; the same plans re-simulated "
        "with it. Busiest rank's compute: the median over steps of the largest per-rank compute_s (forward and "
        "backward, emulation sleeps included) beside the simulator's largest stage forward + backward: where "
        "the two errors are alike, the gap is compute running slower than profiled, not the schedule or the "
        "links."
    )


# --------------------------------------------------------------------------- torch.distributed.pipelining
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_pp_worker(args: argparse.Namespace) -> None:
    """One stage of the torch.distributed.pipelining run (launched by :func:`run_torch_pp`)."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from hetplan.runtime.optim import make_optimizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    model = json.loads(args.model)
    zoo = resolve_model(model)
    start, end = (0, args.cut) if rank == 0 else (args.cut, zoo.n_blocks)
    module = nn.Sequential(*zoo.build_blocks(start, end, SEED))
    stage = PipelineStage(module, rank, 2, torch.device("cpu"))
    batch = args.batch

    def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return zoo.loss(output, target) / batch  # a micro-batch's share of the global batch's mean loss

    # scale_grads=False: the loss is already divided by the global batch, as hetplan's runtime does
    schedule = Schedule1F1B(stage, args.micro, loss_fn=loss_fn, scale_grads=False)
    optimizer = make_optimizer("adam", list(module.parameters()), DEFAULT_LR["adam"])
    times, losses_out = [], []
    for step in range(args.steps):
        t0 = time.perf_counter()
        x, y = zoo.sample_batch(batch, seed=SEED, step=step)  # both ends make the batch, as hetplan's ranks do
        losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(x, return_outputs=False)
        else:
            schedule.step(target=y, losses=losses, return_outputs=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total = torch.tensor([float(sum(t.detach() for t in losses)) if losses else 0.0], dtype=torch.float64)
        dist.all_reduce(total)  # the step's mean loss on every rank, as hetplan's runtime logs it
        times.append(time.perf_counter() - t0)
        losses_out.append(float(total[0]))
    Path(args.out).write_text(json.dumps({"rank": rank, "times": times, "losses": losses_out}), encoding="utf-8")
    dist.destroy_process_group()


def run_torch_pp(args: argparse.Namespace, model: dict, cut: int, micro: int, work: Path, into: Runs) -> None:
    port = _free_port()
    procs, outs = [], []
    for rank in range(2):
        out = work / f"torch-pp-{rank}.json"
        out.unlink(missing_ok=True)
        outs.append(out)
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            WORLD_SIZE="2",
            RANK=str(rank),
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(ROOT),
        )
        cmd = [
            sys.executable, __file__, "_torch_pp",
            "--model", json.dumps(model), "--cut", str(cut), "--micro", str(micro),
            "--batch", str(args.batch), "--steps", str(args.steps), "--out", str(out),
        ]  # fmt: skip
        with open(work / f"torch-pp-{rank}.err", "w", encoding="utf-8") as err:  # the child keeps its own handle
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err))
    deadline = time.time() + 300
    while any(p.poll() is None for p in procs) and time.time() < deadline:
        if any(p.poll() not in (None, 0) for p in procs):  # one failed: the other would wait for it
            break
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            p.kill()
    errors = []
    for rank, p in enumerate(procs):
        if p.wait() != 0:
            text = (work / f"torch-pp-{rank}.err").read_text(encoding="utf-8", errors="replace").strip()
            errors.append(f"rank {rank}: " + (text.splitlines()[-1] if text else f"exit code {p.returncode}"))
    if errors:
        raise RuntimeError(f"torch.distributed.pipelining run failed: {errors}")
    results = [json.loads(o.read_text(encoding="utf-8")) for o in outs]
    per_step = [max(r["times"][s] for r in results) for s in range(args.steps)]
    into.steps += per_step[args.warmup :]
    into.run_medians.append(_median(per_step[args.warmup :]))
    into.losses.append(results[0]["losses"][-1])


def pipelining(args: argparse.Namespace, profile: ModelProfile, work: Path) -> None:
    model = profile.model
    n = len(profile.blocks)
    micro_size = args.batch // args.micro
    cluster = load_cluster(CLUSTERS / "local-2.yaml")
    # the cut: balance the blocks' forward FLOPs (DeepSpeed-like; deterministic, unlike measured times)
    cut = args.cut or balanced_cuts([b.flops_fwd + 1.0 for b in profile.blocks], 2)[1]
    a, b = (d.address for d in cluster.devices)
    plan = Plan(
        global_batch=args.batch,
        pipelines=[
            Pipeline(
                batch=args.batch,
                micro_batches=(micro_size,) * args.micro,
                stages=(Stage(0, cut, (a,), (1.0,)), Stage(cut, n, (b,), (1.0,))),
            )
        ],
        schedule="1f1b",
        optimizer="adam",
    )
    config = work / "pipelining-hetplan.yaml"
    write_yaml(build_rank_config(plan, profile, cluster, seed=SEED), config)
    runs = {"hetplan runtime": Runs(), "torch.distributed.pipelining": Runs()}
    for _ in range(args.rounds):
        run_plan(config, steps=args.steps, warmup=args.warmup, emulate=False, into=runs["hetplan runtime"])
        run_torch_pp(args, model, cut, args.micro, work, runs["torch.distributed.pipelining"])
    c = model["config"]
    print(
        f"\n### Pipelining: hetplan's runtime vs torch.distributed.pipelining (Schedule1F1B), 2 processes, gloo, "
        f"no emulation\n\nGPT layers {c['layers']}, hidden {c['hidden']}, seq {c['seq']}, vocab {c['vocab']} "
        f"({n} blocks), stages [0:{cut}] and [{cut}:{n}], global batch {args.batch} as {args.micro} micro-batches "
        f"of {micro_size}, Adam; {args.rounds} runs x {args.steps} steps each, first {args.warmup} of each run "
        "left out, step times measured inside the workers\n"
    )
    print(
        "| runtime | median step (ms) | best step (ms) | samples/s (median) | ratio (median) | ratio (best) "
        "| loss after last step, per run |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    ref = runs["torch.distributed.pipelining"]
    for key, r in runs.items():
        mine = key == "hetplan runtime"
        ratio = f"**{ref.median / r.median:.2f}x** | {ref.best / r.best:.2f}x" if mine else "1.00x | 1.00x"
        losses = ", ".join(f"{v:.5f}" for v in r.losses)
        print(f"| {key} | {_ms(r.median)} | {_ms(r.best)} | {args.batch / r.median:.1f} | {ratio} | {losses} |")
    pairs = paired(runs["torch.distributed.pipelining"], runs["hetplan runtime"])
    print(
        f"\nratio run by run (each pair back to back): {pairs}; ratio = torch's median step / hetplan's "
        "(above 1: hetplan faster)"
    )


# --------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", nargs="?", default="all", choices=("throughput", "accuracy", "pipelining", "all"))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--steps", type=int, default=10, help="steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps of each run left out")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each plan, alternating")
    parser.add_argument("--repeat", type=int, default=9, help="timed runs per block and size when profiling")
    parser.add_argument("--micro", type=int, default=4, help="pipelining: micro-batches per step")
    parser.add_argument("--cut", type=int, default=None, help="pipelining: first block of stage 1 (default: by FLOPs)")
    parser.add_argument("--clusters", nargs="+", default=["local-4", "local-2"])
    args = parser.parse_args()

    print(f"$ {shlex.join(['python', 'benchmarks/bench_runtime.py', *sys.argv[1:]])}")
    print(
        f"\nmachine: {os.cpu_count()} CPU cores, torch {torch.__version__}, one thread per rank; "
        f"at start: {load_text()}"
    )
    started = time.time()
    model = gpt_model(args)
    profile = measure(model, args.repeat)
    c = model["config"]
    print(
        f"model: zoo GPT, layers {c['layers']}, hidden {c['hidden']}, heads {c['heads']}, seq {c['seq']}, vocab "
        f"{c['vocab']} ({len(profile.blocks)} blocks, {sum(b.params for b in profile.blocks):,} parameters), Adam; "
        f"profile measured here at micro-batches {', '.join(map(str, MICRO_SIZES))} (median of {args.repeat}, one "
        "thread)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        work = Path(tmp)
        if args.what in ("throughput", "accuracy", "all"):
            cases = throughput_runs(args, profile, work)
            if args.what in ("throughput", "all"):
                print_throughput(cases, args)
                print(f"\n(after the throughput runs: {load_text()})")
            if args.what in ("accuracy", "all"):
                for c in cases:
                    used = sorted({d for p in c.plans.values() for d in p.all_devices()})
                    slowdowns = sorted(c.cluster.device(d).type.slowdown for d in used)
                    contended = measure_contended(model, args.repeat, slowdowns[1:])  # this process: the fastest
                    c.contended = {k: simulate(p, contended, c.cluster).iteration_s for k, p in c.plans.items()}
                print_accuracy(cases, args)
        if args.what in ("pipelining", "all"):
            pipelining(args, profile, work)
    print(f"\n{time.time() - started:.0f} s in all; at the end: {load_text()}")


def _hidden() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode")
    parser.add_argument("--model", required=True)
    parser.add_argument("--cut", type=int)
    parser.add_argument("--micro", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--out")
    parser.add_argument("--slowdown", type=float, default=1.0)
    args = parser.parse_args()
    if args.mode == "_load":
        load_worker(json.loads(args.model), args.slowdown)
    else:
        torch_pp_worker(args)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("_load", "_torch_pp"):
        _hidden()
    else:
        main()

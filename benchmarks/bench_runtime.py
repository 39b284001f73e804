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
  alone, and from a *contended* profile measured while ``world - 1`` other single-thread processes
  train the same model, as the other ranks do during a run) beside the measured median.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from planner.contracts.cluster import Cluster, load_cluster  # noqa: E402
from planner.contracts.model_profile import ModelProfile  # noqa: E402
from planner.contracts.plan import Pipeline, Plan, Stage  # noqa: E402
from planner.contracts.yamlio import write_yaml  # noqa: E402
from planner.emit import build_rank_config  # noqa: E402
from planner.emit.rank_config import DEFAULT_LR  # noqa: E402
from planner.models import resolve_model  # noqa: E402
from planner.profile.measure import measure_profile  # noqa: E402
from planner.runtime.launcher import launch_local  # noqa: E402
from planner.simulate import simulate  # noqa: E402
from planner.solve import PlanOptions, plan_training  # noqa: E402
from planner.solve.baselines import balanced_cuts  # noqa: E402

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


def load_worker(model: dict) -> None:
    """A background load: train the model on one thread forever (killed by the parent)."""
    torch.set_num_threads(1)
    zoo = resolve_model(model)
    blocks = zoo.build_blocks(0, zoo.n_blocks, SEED)
    x, y = zoo.sample_batch(8, seed=SEED, step=0)
    print("ready", flush=True)
    while True:
        h = x
        for b in blocks:
            h = b(h)
        zoo.loss(h, y).backward()


def measure_contended(model: dict, repeat: int, loaders: int) -> ModelProfile:
    """The profile measured while ``loaders`` other one-thread processes train the same model.

    During a run every rank competes for the cores with the others; this measures each block under
    the same kind of competition (the loaders never sleep, unlike emulated slow ranks, so with more
    ranks than cores it overstates the competition somewhat).
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "_load", "--model", json.dumps(model)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(loaders)
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

    @property
    def median(self) -> float:
        return _median(self.steps)

    @property
    def best(self) -> float:
        return min(self.steps) if self.steps else float("nan")


def run_plan(config_path: Path, *, steps: int, warmup: int, emulate: bool, into: Runs) -> None:
    result = launch_local(config_path, steps=steps, emulate=emulate, threads=1)
    per_step: dict[int, float] = {}
    last_loss: dict[int, float] = {}
    for r in result.records:
        per_step[r["step"]] = max(per_step.get(r["step"], 0.0), r["iteration_s"])
        last_loss[r["step"]] = r["loss"]
    into.steps += [t for s, t in sorted(per_step.items()) if s >= warmup]
    into.losses.append(last_loss[max(last_loss)])


def describe(plan: Plan, cluster: Cluster) -> str:
    """``2 x [cpu-fast] b21 + ...``: each pipeline's stages (device type[blocks]) and batch share."""
    types = {d.address: d.type.name for d in cluster.devices}
    parts = []
    for p in plan.pipelines:
        stages = " > ".join(f"{'+'.join(types[d] for d in s.devices)}[{s.start}:{s.end}]" for s in p.stages)
        sizes = sorted(set(p.micro_batches))
        micro = "/".join(str(m) for m in sizes)
        parts.append(f"{stages} b{p.batch} (mb {micro})")
    return "; ".join(parts)


@dataclass
class ClusterCase:
    name: str
    cluster: Cluster
    plans: dict[str, Plan]
    predicted: dict[str, float]
    runs: dict[str, Runs]
    contended: dict[str, float] = field(default_factory=dict)


def throughput_runs(args: argparse.Namespace, profile: ModelProfile, work: Path) -> list[ClusterCase]:
    cases = []
    for name in args.clusters:
        cluster = load_cluster(CLUSTERS / f"{name}.yaml")
        result = plan_training(profile, cluster, PlanOptions(global_batch=args.batch, micro_batch_sizes=MICRO_SIZES))
        uniform = result.baselines.get("uniform")
        plans = {"hetplan": result.plan}
        predicted = {"hetplan": result.sim.iteration_s}
        if uniform is not None and uniform.sim is not None:
            plans["uniform"] = uniform.plan
            predicted["uniform"] = uniform.sim.iteration_s
        runs = {k: Runs() for k in plans}
        paths = {}
        for key, plan in plans.items():
            paths[key] = work / f"{name}-{key}.yaml"
            write_yaml(build_rank_config(plan, profile, cluster, seed=SEED), paths[key])
        for _ in range(args.rounds):
            for key in plans:
                run_plan(paths[key], steps=args.steps, warmup=args.warmup, emulate=True, into=runs[key])
        cases.append(ClusterCase(name, cluster, plans, predicted, runs))
    return cases


def print_throughput(cases: list[ClusterCase], args: argparse.Namespace) -> None:
    print(
        f"\n### Throughput: hetplan's plan vs the uniform split (emulated devices, global batch {args.batch}, "
        f"{args.rounds} runs x {args.steps} steps each, first {args.warmup} of each run left out)\n"
    )
    print("| cluster | plan | pipelines: stages type[blocks], batch share, micro-batches | median iteration (ms) "
          "| best (ms) | samples/s | speedup |")
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


def print_accuracy(cases: list[ClusterCase], args: argparse.Namespace) -> None:
    print("\n### Accuracy: the simulator's iteration time vs the measured median (the runs above)\n")
    print("| cluster | plan | predicted, profile alone (ms) | error | predicted, contended profile (ms) "
          "| error | measured median (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for c in cases:
        for key in c.plans:
            m = c.runs[key].median
            p = c.predicted[key]
            q = c.contended.get(key)
            contended = f"{_ms(q)} | {m / q - 1:+.0%}" if q else "- | -"
            print(f"| {c.name} | {key} | {_ms(p)} | {m / p - 1:+.0%} | {contended} | {_ms(m)} |")
    print(
        "\nerror = measured / predicted - 1. Contended profile: measured while world - 1 other one-thread "
        "processes trained the same model (local-4: 3, local-2: 1), then the same plans re-simulated with it."
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

    from planner.runtime.optim import make_optimizer

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
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
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errors = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        if p.returncode != 0:
            errors.append((err or "").strip().splitlines()[-1:] or [f"exit code {p.returncode}"])
    if errors:
        for p in procs:
            if p.poll() is None:
                p.kill()
        raise RuntimeError(f"torch.distributed.pipelining run failed: {errors}")
    results = [json.loads(o.read_text(encoding="utf-8")) for o in outs]
    per_step = [max(r["times"][s] for r in results) for s in range(args.steps)]
    into.steps += per_step[args.warmup :]
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
    print("| runtime | median step (ms) | best step (ms) | samples/s | ratio | loss after last step, per run |")
    print("|---|---:|---:|---:|---:|---|")
    ref = runs["torch.distributed.pipelining"].median
    for key, r in runs.items():
        ratio = f"**{ref / r.median:.2f}x**" if key == "hetplan runtime" else "1.00x"
        losses = ", ".join(f"{v:.5f}" for v in r.losses)
        print(
            f"| {key} | {_ms(r.median)} | {_ms(r.best)} | {args.batch / r.median:.1f} | {ratio} | {losses} |"
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
    parser.add_argument("--steps", type=int, default=12, help="steps per run")
    parser.add_argument("--warmup", type=int, default=2, help="steps of each run left out")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each plan, alternating")
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
    with tempfile.TemporaryDirectory(prefix="bench-runtime-") as tmp:
        work = Path(tmp)
        if args.what in ("throughput", "accuracy", "all"):
            cases = throughput_runs(args, profile, work)
            if args.what in ("throughput", "all"):
                print_throughput(cases, args)
            if args.what in ("accuracy", "all"):
                for c in cases:
                    world = max(len(p.all_devices()) for p in c.plans.values())
                    contended = measure_contended(model, args.repeat, max(1, world - 1))
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
    args = parser.parse_args()
    if args.mode == "_load":
        load_worker(json.loads(args.model))
    else:
        torch_pp_worker(args)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("_load", "_torch_pp"):
        _hidden()
    else:
        main()

"""Co-scheduling: two training jobs on the same (emulated) devices at once, beside one after the other.

    python benchmarks/bench_corun.py                 # 2 rounds, both pairs of jobs, 30 steps each
    python benchmarks/bench_corun.py --rounds 1 --steps 10 --pairs dp+dp

Two emulated devices, one per node (``n0/0``, ``n1/0``: the CPU stretched ``--slowdown`` times, so
that most of a compute is the emulation's sleep and the two jobs' four ranks do not need more than
this machine's two cores), joined by an emulated slow network (``emulate: true``: every transfer and
collective on it lasts at least its bytes over the stated bandwidth plus latency). The bandwidth is
sized from a profile measured here so that a data-parallel job's gradient all-reduce takes about
``--comm-ratio`` times its step's compute as the profile prices it (the runtime's ranks spend more
CPU time than the profile per micro-batch: the printed ``compute_s`` table shows by how much).
Zoo GPT, Adam, global batch 16 per job, two pairs:

* ``dp+dp``: two data-parallel jobs on both devices (two one-device pipelines of 8 samples, 2
  micro-batches of 4), seeds 3 and 4: each waits for its gradient all-reduce on the slow network;
* ``pipe+dp``: job a a two-stage pipeline ``n0/0 -> n1/0`` (1F1B, 4 micro-batches of 4: activations
  and gradients cross the network), job b data-parallel as above.

Each round runs, per pair, the jobs one after the other (``train_here`` twice), then together
(``train_together``: each job its own torchrun group, the devices shared by turns), ``--steps``
steps each; the arms alternate so that the machine's load (other work shares its two cores) hits
both alike. Figures, per arm:

* **span**: a job's training time is the sum of its steps' iteration times (slowest rank). One after
  the other the spans add up; together the jobs start at the same moment (the co-run's start line)
  and the co-run lasts as long as the longer one. Combined samples/s = both jobs' samples over that:
  the same work either way, start-up (torchrun, imports) left out.
* **steady state**: each job's median iteration (slowest rank) from step 2 on, in the co-run only
  over the steps that end before the other job has finished; combined samples/s one after the other
  = (b_a + b_b) / (t_a + t_b), together = b_a / t'_a + b_b / t'_b: the co-simulation's definitions
  (``hetplan.simulate.together``), printed beside it.

Every co-run's losses are checked against the same job's solo run (within 1e-5). Prints Markdown
for docs/benchmarks.md with the command and the machine's load.

**Real compute** (``--real``, and ``--device cuda``): the emulated runs above measure one job's
emulation sleeps overlapping the other's, which is not what two jobs on one GPU do. ``--real`` runs
the same pairs with no emulation at all: one node of two devices of the type the profile was
measured on (``cpu`` here; the GPU's type with ``--device cuda``), every compute real, transfers
over loopback gloo. On this 2-core CPU the two jobs' four ranks share two cores (the turn keeps
each device's two ranks from computing at once; the cores are still shared by the ranks of two
devices and the gloo threads). ``--device cuda`` puts every rank on the one visible GPU through
the host-staged gloo transport (``compute_device: cuda``; docs/runtime.md, "host-staged"): the two
"devices" ``n0/0`` and ``n0/1`` are the same GPU, so a job alone already shares it between its two
ranks, and the co-simulation's prediction (which sees two GPUs) is for two GPUs, printed beside the
measure as the planner's what-if. Defaults for the GPU: 1 round, ``pipe+dp``, 30 steps, a larger
GPT (76 s on one H100, three torchrun start-ups included).

    python benchmarks/bench_corun.py --real --rounds 1 --steps 12          # CPU, real compute
    python benchmarks/bench_corun.py --device cuda                          # one GPU, ~76 s
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _importable() -> None:
    """``hetplan`` from this checkout without an install (a bare GPU machine): a link
    ``hetplan -> planner`` in a scratch folder, first on the path here and on the ranks' PYTHONPATH
    (as benchmarks/gpu_check.py does)."""
    try:
        import hetplan  # noqa: F401
    except ImportError:
        import tempfile

        shim = Path(tempfile.mkdtemp(prefix="hetplan-shim-"))
        (shim / "hetplan").symlink_to(ROOT / "planner", target_is_directory=True)
        sys.path.insert(0, str(shim))
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))


_importable()

from hetplan.contracts.cluster import Cluster, parse_cluster  # noqa: E402
from hetplan.contracts.plan import Pipeline, Plan, Stage  # noqa: E402
from hetplan.local_job import TrainingOptions, train_here, train_together  # noqa: E402
from hetplan.profile.measure import measure_profile  # noqa: E402

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 64}}
#: on a GPU: large enough that a micro-batch is more than kernel launches, small enough for a minute
GPT_CUDA = {"family": "gpt", "config": {"layers": 4, "hidden": 512, "heads": 8, "seq": 256, "vocab": 512}}
N_BLOCKS = 2 * GPT["config"]["layers"] + 2  # embedding, attention and MLP per layer, head
BATCH = 16
MICRO = 4
OPTIONS = (TrainingOptions(seed=3, lr=3e-3), TrainingOptions(seed=4, lr=3e-3))


def cluster(bandwidth: float, slowdown: float, latency: str = "2ms") -> Cluster:
    """Two nodes of one emulated device each, an emulated network between them."""
    device = [{"type": "emu", "count": 1, "emulate": {"base": "cpu", "slowdown": slowdown, "memory": "4GiB"}}]
    return parse_cluster(
        {
            "schema": "hetplan/cluster/v1",
            "name": "corun-bench",
            "nodes": [{"name": "n0", "devices": device}, {"name": "n1", "devices": device}],
            "network": {"bandwidth": f"{bandwidth:.0f}B/s", "latency": latency, "emulate": True},
        },
        file="corun-bench",
    )


LOOPBACK = {"bandwidth": "3.5GB/s", "latency": "400us"}


def real_cluster(type_name: str) -> Cluster:
    """One node of two devices of the measured type, nothing emulated (``--real``)."""
    return parse_cluster(
        {
            "schema": "hetplan/cluster/v1",
            "name": "corun-real",
            # gloo over loopback (benchmarks/bench_loopback.py); on a GPU the host-staged copies add to it
            "nodes": [{"name": "n0", "devices": [{"type": type_name, "count": 2}], "link": LOOPBACK}],
            "network": LOOPBACK,  # one node: never used
        },
        file="corun-real",
    )


def plans(devices: tuple[str, str] = ("n0/0", "n1/0"), n_blocks: int = N_BLOCKS) -> tuple[Plan, Plan]:
    cut = n_blocks // 2
    micro = (MICRO,) * (BATCH // MICRO)
    first, second = devices
    pipe = Plan(
        global_batch=BATCH,
        pipelines=[Pipeline(BATCH, micro, (Stage(0, cut, (first,), (1.0,)), Stage(cut, n_blocks, (second,), (1.0,))))],
        optimizer="adam",
        file="a (pipeline)",
    )
    half = BATCH // 2
    dp = Plan(
        global_batch=BATCH,
        pipelines=[Pipeline(half, (MICRO,) * (half // MICRO), (Stage(0, n_blocks, (d,), (1.0,)),)) for d in devices],
        optimizer="adam",
        file="b (data-parallel)",
    )
    return pipe, dp


def _per_step(records: list[dict]) -> list[float]:
    """Each step's iteration time: its slowest rank's."""
    steps = sorted({r["step"] for r in records})
    return [max(r["iteration_s"] for r in records if r["step"] == s) for s in steps]


def span(records: list[dict]) -> float:
    """The job's training time: its steps' iteration times added up."""
    return sum(_per_step(records))


def steady(records: list[dict], until: float | None = None) -> float:
    """The median iteration from step 2 on (the first two: warm-up, and the step whose memory the CPU
    run measures under the profiler); with ``until``, only steps that end before then (seconds from
    the job's first step: the other job of a co-run was still running)."""
    times = _per_step(records)
    ends = [sum(times[: i + 1]) for i in range(len(times))]
    kept = [t for i, (t, e) in enumerate(zip(times, ends, strict=True)) if i >= 2 and (until is None or e <= until)]
    return statistics.median(kept or times[2:])


def mean_per_step(records: list[dict], key: str) -> float:
    """A run-log field's mean over ranks and steps (from step 2 on)."""
    return statistics.mean(r[key] for r in records if r["step"] >= 2)


def simulated(plans: tuple[Plan, Plan], profile, bench_cluster: Cluster, policy: str):
    """The co-simulation's figures, if this checkout has it (``hetplan.simulate.together``)."""
    try:
        from hetplan.simulate.together import TogetherJob, simulate_together
    except ImportError:
        return None
    jobs = [TogetherJob(n, p, profile, bench_cluster) for n, p in zip("ab", plans, strict=True)]
    return simulate_together(jobs, policy=policy, iterations=8)


def run_pair(
    jobs: list, steps: int, *, options: tuple = OPTIONS, emulate: bool = True, tolerance: float = 1e-5
) -> dict:
    """One round of one pair: one after the other, then together; the losses checked equal."""
    t0 = time.time()
    alone = [
        train_here(*job, steps=steps, options=o, emulate=emulate).records for job, o in zip(jobs, options, strict=True)
    ]
    seq_wall = time.time() - t0
    t0 = time.time()
    co = train_together(jobs, steps=steps, options=options, emulate=emulate)
    co_wall = time.time() - t0
    together = [job.records for job in co.jobs]
    for a, c in zip(alone, together, strict=True):  # each job trained exactly as alone
        la = [x["loss"] for x in a if x["rank"] == 0 and x["loss"] is not None]
        lc = [x["loss"] for x in c if x["rank"] == 0 and x["loss"] is not None]
        assert max(abs(x - y) for x, y in zip(la, lc, strict=True)) <= tolerance, (la, lc)
    return {"alone": alone, "together": together, "seq_wall": seq_wall, "co_wall": co_wall,
            "load": os.getloadavg()[0], "summary": co.summary}  # fmt: skip


def report(name: str, runs: list[dict], plans: tuple[Plan, Plan], profile, bench: Cluster, steps: int) -> None:
    samples = sum(p.global_batch for p in plans) * steps
    print(f"\n#### {name}\n")
    print(
        "| round | load | span a, b alone (s) | one after the other (s) | span a, b together (s) | together (s) "
        "| samples/s one after the other | samples/s together | **ratio** |"
    )
    print("|---:|---:|---|---:|---|---:|---:|---:|---:|")
    for i, run in enumerate(runs):
        sa, sb = (span(r) for r in run["alone"])
        ca, cb = (span(r) for r in run["together"])
        seq, cor = sa + sb, max(ca, cb)
        print(
            f"| {i + 1} | {run['load']:.1f} | {sa:.2f}, {sb:.2f} | {seq:.2f} | {ca:.2f}, {cb:.2f} | {cor:.2f} "
            f"| {samples / seq:.1f} | {samples / cor:.1f} | **{seq / cor:.2f}x** |"
        )
    print(
        "\n| steady state | iteration a, b alone (ms) | a, b together (ms) | samples/s one after the other "
        "| samples/s together | ratio |"
    )
    print("|---|---|---|---:|---:|---:|")
    ba, bb = (p.global_batch for p in plans)
    for i, run in enumerate(runs):
        ta, tb = (steady(r) for r in run["alone"])
        first_end = min(span(r) for r in run["together"])
        ca, cb = (steady(r, until=first_end) for r in run["together"])
        seq, cor = (ba + bb) / (ta + tb), ba / ca + bb / cb
        print(
            f"| measured, round {i + 1} | {ta * 1e3:.0f}, {tb * 1e3:.0f} | {ca * 1e3:.0f}, {cb * 1e3:.0f} "
            f"| {seq:.1f} | {cor:.1f} | {cor / seq:.2f}x |"
        )
    for policy in ("first-come", "crossover"):
        sim = simulated(plans, profile, bench, policy)
        if sim is None:
            print("| co-simulation | (hetplan.simulate.together is not in this checkout) | | | | |")
            break
        a, b = sim.jobs
        label = "the runtime's turns" if policy == "first-come" else "keep-while-ready"
        print(
            f"| co-simulation, `{policy}` ({label}) | {a.solo_iteration_s * 1e3:.0f}, {b.solo_iteration_s * 1e3:.0f} "
            f"| {a.co_iteration_s * 1e3:.0f}, {b.co_iteration_s * 1e3:.0f} | {sim.sequential_samples_per_s:.1f} "
            f"| {sim.combined_samples_per_s:.1f} | {sim.combined_samples_per_s / sim.sequential_samples_per_s:.2f}x |"
        )

    print(
        "\n| round | compute_s a, b alone (ms per step, mean over ranks) | compute_s a, b together "
        "| wait_s a, b together minus alone (ms per step; the turn's wait is in it) |"
    )
    print("|---:|---|---|---|")
    for i, run in enumerate(runs):
        alone = ", ".join(f"{mean_per_step(r, 'compute_s') * 1e3:.0f}" for r in run["alone"])
        together = ", ".join(f"{mean_per_step(r, 'compute_s') * 1e3:.0f}" for r in run["together"])
        extra = ", ".join(
            f"{(mean_per_step(c, 'wait_s') - mean_per_step(a, 'wait_s')) * 1e3:.0f}"
            for a, c in zip(run["alone"], run["together"], strict=True)
        )
        print(f"| {i + 1} | {alone} | {together} | {extra} |")


def main_real(args: argparse.Namespace) -> None:
    """``--real`` / ``--device cuda``: the pairs with every compute real, nothing emulated (module
    docstring), beside the co-simulation's prediction from a profile measured here."""
    cuda = args.device == "cuda"
    model = GPT_CUDA if cuda else GPT
    n_blocks = 2 * model["config"]["layers"] + 2
    t0 = time.time()
    profile = measure_profile(model, micro_batches=(MICRO,), device=args.device, threads=1, repeat=5)
    type_name = next(iter(profile.blocks[0].times))
    compute = sum(b.times[type_name][MICRO].fwd + b.times[type_name][MICRO].bwd for b in profile.blocks)
    bench = real_cluster(type_name)
    pipe, dp = plans(("n0/0", "n0/1"), n_blocks)
    pairs = {"dp+dp": (dp, dp), "pipe+dp": (pipe, dp)}
    chosen = [p.strip() for p in args.pairs.split(",")]
    extra = {"compute_device": "cuda", "accept_device_mismatch": True} if cuda else {}
    options = tuple(TrainingOptions(seed=o.seed, lr=o.lr, **extra) for o in OPTIONS)
    where = "one GPU shared by every rank (host-staged gloo)" if cuda else "this CPU, one thread per rank"
    print(
        f"\nREAL compute, nothing emulated: {where}; device type {type_name}; model {model['config']}; "
        f"measured compute (fwd+bwd) per micro-batch of {MICRO}: {compute * 1e3:.2f} ms "
        f"(profiled in {time.time() - t0:.1f} s)"
    )
    runs: dict[str, list[dict]] = {name: [] for name in chosen}
    for r in range(args.rounds):
        for name in chosen:
            jobs = [(p, profile, bench) for p in pairs[name]]
            run = run_pair(jobs, args.steps, options=options, emulate=False, tolerance=1e-4 if cuda else 1e-5)
            runs[name].append(run)
            print(f"\nround {r + 1}, {name}: one after the other {run['seq_wall']:.1f} s wall, together "
                  f"{run['co_wall']:.1f} s wall (start-up included)\n{run['summary']}")  # fmt: skip
    for name in chosen:
        report(name, runs[name], pairs[name], profile, bench, args.steps)
    print(f"\nload at end {tuple(round(x, 2) for x in os.getloadavg())}; total {time.time() - t0:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (1 with --device cuda)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--pairs", default=None, help="comma-separated: dp+dp, pipe+dp (default both; cuda: pipe+dp)")
    parser.add_argument("--slowdown", type=float, default=16.0, help="the emulated devices' slowdown")
    parser.add_argument("--comm-ratio", type=float, default=1.0, help="a DP job's all-reduce over its step's compute")
    parser.add_argument("--real", action="store_true", help="no emulation: every compute real (module docstring)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda implies --real")
    args = parser.parse_args()
    print(f"command: python benchmarks/bench_corun.py {' '.join(sys.argv[1:])}")
    print(f"load at start {tuple(round(x, 2) for x in os.getloadavg())}")
    cuda = args.device == "cuda"
    args.rounds = args.rounds if args.rounds is not None else (1 if cuda else 2)
    args.pairs = args.pairs or ("pipe+dp" if cuda else "dp+dp,pipe+dp")
    if args.real or cuda:
        main_real(args)
        return
    profile = measure_profile(GPT, micro_batches=(MICRO,), threads=1, repeat=5)
    compute = sum(t.fwd + t.bwd for b in profile.blocks for t in (b.times["cpu"][MICRO],))
    dp_compute = 2 * compute * args.slowdown  # two micro-batches of the whole model per device
    grad = sum(b.param_bytes for b in profile.blocks)
    bandwidth = grad / (args.comm_ratio * dp_compute)  # a 2-device ring moves the gradient's bytes once
    bench = cluster(bandwidth, args.slowdown)
    pipe, dp = plans()
    pairs = {"dp+dp": (dp, dp), "pipe+dp": (pipe, dp)}
    chosen = [p.strip() for p in args.pairs.split(",")]
    print(
        f"\nmodel {GPT['config']}, gradient {grad / 1e6:.2f} MB; measured compute (fwd+bwd) per micro-batch of "
        f"{MICRO} {compute * 1e3:.1f} ms (cpu), emulated devices {args.slowdown:g}x slower; emulated network "
        f"{bandwidth / 1e6:.3f} MB/s, 2 ms"
    )
    runs: dict[str, list[dict]] = {name: [] for name in chosen}
    for r in range(args.rounds):
        for name in chosen:
            run = run_pair([(p, profile, bench) for p in pairs[name]], args.steps)
            runs[name].append(run)
            print(f"\nround {r + 1}, {name}: one after the other {run['seq_wall']:.1f} s wall, together "
                  f"{run['co_wall']:.1f} s wall (start-up included)\n{run['summary']}")  # fmt: skip
    for name in chosen:
        report(name, runs[name], pairs[name], profile, bench, args.steps)
    print(f"\nload at end {tuple(round(x, 2) for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

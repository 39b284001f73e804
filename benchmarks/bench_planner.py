"""Planner benchmarks: the plan beside every baseline, planning speed, and optimality.

    python benchmarks/bench_planner.py baselines     # every bundled heterogeneous cluster + real profiles
    python benchmarks/bench_planner.py speed         # time to plan, growing devices and blocks
    python benchmarks/bench_planner.py optimality    # 200 random small instances vs exhaustive search
    python benchmarks/bench_planner.py cli [--before REF] [--repeat N] [--new DIR]
                                                     # `hetplan plan` from the command line, this tree
                                                     # (or DIR's planner/) beside REF's (default
                                                     # HEAD~1), interleaved

Prints Markdown tables (docs/benchmarks.md quotes them) and the command that made them. Timings are
wall-clock and the process's CPU time on whatever runs this (here: 2 shared cores), best of three
for the first table, one run for the growth tables, and the load average before and after.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "solve"))

from hetplan.contracts import load_catalog, load_cluster  # noqa: E402
from hetplan.profile.analytic import analytic_profile  # noqa: E402
from hetplan.profile.carry import carry_times  # noqa: E402
from hetplan.profile.importers import import_pipedream, import_sailor  # noqa: E402
from hetplan.solve import PlanOptions, plan_training  # noqa: E402
from hetplan.solve.baselines import BASELINES  # noqa: E402

CLUSTERS = ROOT / "profiles" / "clusters"
SHARED = ROOT.parent / "shared" / "external"
OPT350 = {"layers": 24, "hidden": 1024, "heads": 16, "seq": 2048, "vocab": 50272}


def _gpt(cluster, **config):
    catalog = load_catalog()
    return analytic_profile(
        "gpt", config or OPT350, devices=[catalog.get(t) for t in cluster.device_types], dtype="fp16"
    )


def baseline_cases():
    """(case name, profile name, profile, cluster, global batch)."""
    cases = []
    for name, batch in (
        ("mixed-small", 64),
        ("mixed-a100-v100", 512),
        ("v100-t4", 256),
        ("rtx-mix", 256),
        ("a100-40-v100", 512),
        ("scale-a100-v100", 2048),
    ):
        cluster = load_cluster(CLUSTERS / f"{name}.yaml")
        cases.append((name, "GPT-24 (OPT-350-like), analytic", _gpt(cluster), cluster, batch))
    if SHARED.is_dir():
        sailor = SHARED / "sailor" / "profiles.json"
        for name in ("a100-40-v100", "rtx-mix"):
            cluster = load_cluster(CLUSTERS / f"{name}.yaml")
            profile = import_sailor(sailor, model="OPT-350", gpu_types=list(cluster.device_types))
            cases.append((name, "Sailor OPT-350 (measured)", profile, cluster, 512))
        catalog = load_catalog()
        v100_t4 = load_cluster(CLUSTERS / "v100-t4.yaml")
        for graph, batch_size in (("vgg16", None), ("gnmt", 64)):
            imported = import_pipedream(
                SHARED / "pipedream" / f"{graph}.graph.txt", batch_size=batch_size, drop_input_time=True
            )
            profile = carry_times(imported, "V100-16GB", [catalog.get("T4")], catalog=catalog)
            cases.append(("v100-t4", f"PipeDream {graph} (V100 measured, T4 carried)", profile, v100_t4, 256))
    else:
        print("(../shared/external is absent: the imported-profile cases are skipped)")
    return cases


def run_baselines() -> None:
    print("| cluster | profile | batch | hetplan | " + " | ".join(BASELINES) + " |")
    print("|---|---|---|---|" + "---|" * len(BASELINES))
    for cluster_name, profile_name, profile, cluster, batch in baseline_cases():
        result = plan_training(profile, cluster, PlanOptions(global_batch=batch))
        best = result.sim.iteration_s
        cells = []
        for name in BASELINES:
            b = result.baselines.get(name)
            cells.append("does not fit" if b is None else f"{b.sim.iteration_s / best:.2f}x")
        print(f"| {cluster_name} | {profile_name} | {batch} | {best * 1e3:.1f} ms | " + " | ".join(cells) + " |")
    print("\nCells: the baseline's simulated iteration time divided by hetplan's (above 1: hetplan is faster).")


def _best_of(fn, repeat: int = 3) -> str:
    """``"wall s (CPU s)"``, each the best of ``repeat``: on a shared machine the process's CPU time
    is what planning costs, the wall time what it took under that load."""
    wall, cpu = float("inf"), float("inf")
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall = min(wall, time.perf_counter() - start)
        cpu = min(cpu, time.process_time() - start_cpu)
    return f"{wall:.2f} s ({cpu:.2f} s CPU)"


def run_speed() -> None:
    print(f"(load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} before)\n")
    scale = load_cluster(CLUSTERS / "scale-a100-v100.yaml")
    profile = _gpt(scale)
    print(f"GPT-24 at sub-block granularity: {len(profile.blocks)} blocks\n")
    print("| cluster | devices | search only | search + 7 baselines |")
    print("|---|---|---|---|")
    for name, batch in (("mixed-a100-v100", 512), ("scale-a100-v100", 2048)):
        cluster = load_cluster(CLUSTERS / f"{name}.yaml")
        prof = _gpt(cluster)
        search = _best_of(
            lambda c=cluster, p=prof, b=batch: plan_training(p, c, PlanOptions(global_batch=b, baselines=False))
        )
        full = _best_of(lambda c=cluster, p=prof, b=batch: plan_training(p, c, PlanOptions(global_batch=b)))
        print(f"| {name} | {len(cluster.devices)} | {search} | {full} |")
    print("\nGrowth with blocks (GPT layers at sub-block granularity, scale-a100-v100, batch 2048, full planning):\n")
    print("| layers | blocks | seconds |")
    print("|---|---|---|")
    for layers in (6, 12, 24, 48):
        prof = _gpt(scale, **{**OPT350, "layers": layers})
        t = _best_of(lambda p=prof: plan_training(p, scale, PlanOptions(global_batch=2048)), repeat=1)
        print(f"| {layers} | {len(prof.blocks)} | {t} |")
    print("\nGrowth with devices (first k nodes of scale-a100-v100: A100 nodes first, GPT-24, full planning):\n")
    print("| nodes | devices | seconds |")
    print("|---|---|---|")
    import yaml

    raw = yaml.safe_load((CLUSTERS / "scale-a100-v100.yaml").read_text())
    from hetplan.contracts.cluster import parse_cluster

    for nodes in (2, 4, 8, 16, 32, 64):
        # half A100 nodes, half V100 nodes where possible
        a100 = [n for n in raw["nodes"] if n["devices"][0]["type"] == "A100-40GB"]
        v100 = [n for n in raw["nodes"] if n["devices"][0]["type"] == "V100-16GB"]
        take = a100[: max(1, nodes // 4)] + v100[: nodes - max(1, nodes // 4)]
        data = {**raw, "nodes": take, "network": {k: v for k, v in raw["network"].items() if k != "groups"}}
        cluster = parse_cluster(data, file="subset")
        prof = _gpt(cluster)
        t = _best_of(lambda c=cluster, p=prof: plan_training(p, c, PlanOptions(global_batch=2048)), repeat=1)
        print(f"| {nodes} | {len(cluster.devices)} | {t} |")
    print(f"\n(load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} after)")


def run_optimality(count: int = 200, seed: int = 0) -> None:
    import brute_force
    from builders import make_cluster, make_profile

    rng = random.Random(seed)
    types = ["A100-80GB", "V100-16GB", "T4"]
    gaps, sizes = [], []
    for _ in range(count):
        n_types, n_devices, n_nodes = rng.randint(2, 3), rng.randint(2, 6), rng.randint(1, 3)
        nodes: dict[str, dict[str, int]] = {}
        for i in range(n_devices):
            node = f"n{rng.randint(0, n_nodes - 1) if i else 0}"
            t = types[rng.randint(0, n_types - 1)]
            nodes.setdefault(node, {}).setdefault(t, 0)
            nodes[node][t] += 1
        n_blocks = rng.randint(2, 12)
        base = [(rng.uniform(0.1, 2.0), rng.uniform(0.1, 4.0)) for _ in range(12)]
        speed = {t: rng.uniform(1.0, 4.0) for t in types}
        out, params, batch = rng.choice([0.0, 1e7, 1e8]), rng.choice([0, 10_000_000]), rng.randint(1, 4)
        inter = rng.choice(["1GB/s", "10GB/s", "100Gbps"])
        cluster = make_cluster(
            [(n, list(d.items())) for n, d in sorted(nodes.items())], intra="50GB/s", inter=inter, inter_latency="10us"
        )
        while True:
            per_block = {t: [(f / speed[t], b / speed[t]) for f, b in base[:n_blocks]] for t in types}
            profile = make_profile(n_blocks, per_block=per_block, output_bytes=out, params=params)
            size = brute_force.space_size(cluster, n_blocks, batch)
            if size <= 2500 or n_blocks <= 2:
                break
            n_blocks -= 1
        best, _ = brute_force.best_plan(profile, cluster, batch)
        planned = plan_training(
            profile, cluster, PlanOptions(global_batch=batch, optimizer="sgd", micro_batch_sizes=(1,), baselines=False)
        )
        gaps.append(planned.sim.iteration_s / best - 1)
        sizes.append((n_devices, n_blocks, size))
    print(
        f"instances: {count} (seed {seed}); devices 2-6 of 2-3 types on 1-3 nodes, blocks up to 12 "
        "(shrunk until the exhaustive space is at most 2500 plans)"
    )
    print(
        f"exhaustive plans per instance: median {statistics.median(s[2] for s in sizes):.0f}, "
        f"max {max(s[2] for s in sizes)}; instances with 6 devices: {sum(s[0] == 6 for s in sizes)}, "
        f"with 12 blocks: {sum(s[1] == 12 for s in sizes)}"
    )
    print(
        f"planner / exhaustive - 1: max {max(gaps):+.4%}, mean {statistics.mean(gaps):+.4%}, "
        f"within 1%: {sum(g <= 0.01 for g in gaps)}/{count}, better (refinement left the space): "
        f"{sum(g < -1e-9 for g in gaps)}"
    )


#: The command-line cases of issue 24: (name, profile arguments, cluster, global batch).
CLI_CASES = (
    (
        "GPT-24 (OPT-350-like)",
        ["gpt", "--layers", "24", "--hidden", "1024", "--heads", "16", "--seq", "2048", "--vocab", "50272"],
        "scale-a100-v100",
        2048,
    ),
    (
        "GPT 7B",
        ["gpt", "--layers", "32", "--hidden", "4096", "--heads", "32", "--seq", "4096", "--vocab", "50272"],
        "scale-a100-v100",
        1024,
    ),
)


def _tree_of(ref: str, into: Path) -> Path:
    """``ref``'s ``planner/``, ``cli.py`` and ``profiles/`` (``git archive``), importable as
    ``hetplan`` from the returned folder (a link named hetplan to its planner/)."""
    import subprocess
    import tarfile

    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", ref, "planner", "cli.py", "profiles"],
        check=True,
        capture_output=True,
    ).stdout
    import io

    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="tar")
    return _importable(tree, into / "path")


def _importable(tree: Path, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "hetplan").symlink_to(tree / "planner")
    return path


def _cli_run(path: Path, args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the process and its children) of ``hetplan ARGS`` with ``hetplan`` from ``path``."""
    import resource
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(path)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "from hetplan.cli import main; main()", *args],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
        cwd=str(path),
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def run_cli(before: str = "HEAD~1", repeat: int = 5, new_tree: Path = ROOT) -> None:
    """``hetplan plan`` from the command line (interpreter start, imports, YAML in and out, search,
    baselines, printing), ``new_tree``'s (default: this tree) and ``before``'s, alternately,
    ``repeat`` times each; the plan files of the two are compared byte for byte. ``new_tree``: a
    folder with a ``planner/`` (a copy of the previous commit with only some files changed, say,
    where other work in this checkout would otherwise be timed with them)."""
    import tempfile

    print(f"(load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} before)\n")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old = _tree_of(before, work / "before")
        new = _importable(new_tree, work / "new")
        print(f"previous: `git archive {before}`; new: {new_tree}; {repeat} runs each, alternating\n")
        print(
            "| case | devices | blocks | previous: best (median) | new: best (median) | best new / previous "
            "| CPU s previous / new | same plan bytes |"
        )
        print("|---|---|---|---|---|---|---|---|")
        for name, model, cluster_name, batch in CLI_CASES:
            cluster = CLUSTERS / f"{cluster_name}.yaml"
            types = ",".join(load_cluster(cluster).device_types)
            profile = work / f"{cluster_name}-{batch}.profile.yaml"
            profile_args = ["profile", *model, "--dtype", "fp16", "--analytic", "--devices", types, "-o", str(profile)]
            _cli_run(new, profile_args)
            blocks = len(load_profile_file(profile).blocks)
            times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
            for i in range(repeat):
                for which, path in (("old", old), ("new", new)) if i % 2 == 0 else (("new", new), ("old", old)):
                    out = work / f"{which}-{cluster_name}-{batch}.plan.yaml"
                    times[which].append(
                        _cli_run(path, ["plan", str(profile), str(cluster), "--batch", str(batch), "-o", str(out)])
                    )
            same = _same_plans(
                work / f"old-{cluster_name}-{batch}.plan.yaml", work / f"new-{cluster_name}-{batch}.plan.yaml"
            )
            cells = []
            for which in ("old", "new"):
                walls = [w for w, _ in times[which]]
                cells.append(f"{min(walls):.2f} s ({statistics.median(walls):.2f} s)")
            best = min(w for w, _ in times["new"]) / min(w for w, _ in times["old"])
            cpu = f"{min(c for _, c in times['old']):.2f} / {min(c for _, c in times['new']):.2f}"
            devices = len(load_cluster(cluster).devices)
            print(
                f"| {name}, batch {batch}, {cluster_name} | {devices} | {blocks} | {cells[0]} | {cells[1]} | "
                f"{best:.2f} | {cpu} | {same} |"
            )
    print(
        "\nWall time of `hetplan plan PROFILE CLUSTER --batch B -o plan.yaml` (a fresh interpreter each run); "
        "CPU s: the best run's process and its children (the planner's second process)."
    )
    print(f"\n(load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} after)")


def _same_plans(old: Path, new: Path) -> str:
    """``yes`` (byte for byte), ``yes but the runners-up`` (the same file but for
    ``details.runners_up``, which issue 24 changed: the winner in another form is left out), or ``NO``."""
    import yaml

    if old.read_bytes() == new.read_bytes():
        return "yes"
    a, b = yaml.safe_load(old.read_text()), yaml.safe_load(new.read_text())
    for data in (a, b):
        data.get("details", {}).pop("runners_up", None)
    return "yes but the runners-up" if a == b else "NO"


def load_profile_file(path: Path):
    from hetplan.contracts.model_profile import load_profile

    return load_profile(path)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "baselines"
    print(f"$ python benchmarks/bench_planner.py {' '.join(sys.argv[1:]) or what}\n")
    if what == "cli":
        import argparse

        parser = argparse.ArgumentParser(prog="bench_planner.py cli")
        parser.add_argument("--before", default="HEAD~1", help="git ref of the previous code (default HEAD~1)")
        parser.add_argument("--repeat", type=int, default=5, choices=range(1, 101), metavar="N")
        parser.add_argument(
            "--new", type=Path, default=ROOT, help="folder holding the new planner/ (default: this tree)"
        )
        parsed = parser.parse_args(sys.argv[2:])
        run_cli(parsed.before, parsed.repeat, parsed.new.resolve())
    else:
        {"baselines": run_baselines, "speed": run_speed, "optimality": run_optimality}[what]()

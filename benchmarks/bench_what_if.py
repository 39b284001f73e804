"""What-if: the published cost comparison answered by hetplan, its Pareto picture, and the search time.

    python benchmarks/bench_what_if.py published     # 128 A100-40GB alone vs + 384 V100-16GB
    python benchmarks/bench_what_if.py pool4         # a pool of four node types, up to 64 nodes each

``published``: a 350M GPT (24 layers, hidden 1024, 16 heads, sequence 1024, fp16; the analytic
profile, ``hetplan profile gpt --analytic``), global batch 1024, Adam. The cluster: 16 nodes of 8
A100-40GB (NVLink 600 GB/s) at $3.74 per GPU-hour; the pool: 48 nodes of 8 V100-16GB (NVLink
300 GB/s) at $2.80 per GPU-hour, the prices the published comparison used; 100 Gb/s between nodes.
It plans the two clusters the publication reports (A100s alone, A100s + all 384 V100s) with the
planner ``hetplan what-if`` runs on every candidate, prints them beside the published figures, then
runs the what-if search itself (``--objective``, ``--max-plans``) and writes the Pareto picture.

``pool4``: one 8-GPU base node and a pool of A100-40GB, V100-16GB, T4 and A10G nodes (1 GPU each,
64 of each on offer) for the same model: the wall time of the search for ``--objective`` and the
number of candidates it planned. Prints Markdown for docs/benchmarks.md with the command and load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.pool import parse_pool
from hetplan.profile.analytic import analytic_profile
from hetplan.solve.search import PlanOptions
from hetplan.solve.whatif import Objective, what_if, what_if_space
from hetplan.solve.whatif_report import what_if_summary
from hetplan.views.whatif import pareto_svg

PUBLISHED = {"A100 alone": (2.47, 0.33), "A100 + 384 V100": (1.90, 0.82)}
MODEL = {"layers": 24, "hidden": 1024, "heads": 16, "seq": 1024}


def _profile(types: list[str]):
    catalog = load_catalog()
    return analytic_profile("gpt", MODEL, devices=[catalog.get(t) for t in types], dtype="fp16")


def _node(kind: str, count: int, link: str, price: float | None = None) -> dict:
    node = {"devices": [{"type": kind, "count": count}], "link": {"bandwidth": link, "latency": "2us"}}
    if price is not None:
        node["price_per_hour"] = round(price * count, 6)
    return node


def _base(nodes: list[dict]) -> dict:
    return {
        "schema": "hetplan/cluster/v1",
        "name": "base",
        "nodes": nodes,
        "network": {"bandwidth": "100Gbps", "latency": "10us"},
    }


def published(args: argparse.Namespace) -> None:
    profile = _profile(["A100-40GB", "V100-16GB"])
    base = _base([{"name": f"a{i}", **_node("A100-40GB", 8, "600GB/s", 3.74)} for i in range(16)])
    pool = {
        "schema": "hetplan/pool/v1",
        "nodes": [{"name": "v100", "count": 48, **_node("V100-16GB", 8, "300GB/s", 2.80)}],
    }
    space = what_if_space(parse_cluster(base, file="base"), base, parse_pool(pool, file="pool"), ladder=args.ladder)
    opts = PlanOptions(global_batch=1024)
    print(
        f"`python benchmarks/bench_what_if.py published {' '.join(sys.argv[2:])}` "
        f"(load average {os.getloadavg()[0]:.2f} before)\n"
    )
    print("| cluster | published s/iter | published $/iter | hetplan s/iter | hetplan $/iter | planned in |")
    print("|---|---|---|---|---|---|")
    from hetplan.solve.training import plan_training

    rows = {}
    for label, counts in (("A100 alone", (16, 0)), ("A100 + 384 V100", (16, 48))):
        t0 = time.perf_counter()
        result = plan_training(profile, space.cluster(counts), opts)
        took = time.perf_counter() - t0
        t = result.sim.iteration_s
        usd = space.price_per_hour(counts) * t / 3600
        rows[label] = (t, usd)
        pt, pu = PUBLISHED[label]
        print(f"| {label} | {pt:.2f} | ${pu:.2f} | {t:.3f} | ${usd:.4f} | {took:.1f} s |")
    (ta, ua), (tb, ub) = rows["A100 alone"], rows["A100 + 384 V100"]
    print(
        f"\nadding the V100s: published {2.47 / 1.90:.2f}x faster at {0.82 / 0.33:.2f}x the $/iter; "
        f"hetplan {ta / tb:.2f}x faster at {ub / ua:.2f}x the $/iter\n"
    )
    t0 = time.perf_counter()
    result = what_if(profile, space, opts, Objective(args.objective), max_plans=args.max_plans, marginals=False)
    took = time.perf_counter() - t0
    summary = what_if_summary(result)
    c = summary["chosen"]
    proof = "exact" if result.exact else f"stopped at {args.max_plans} plans, best bound left {result.gap:.1%} below"
    print(
        f"what-if --objective {args.objective}: {summary['candidates']} candidates, {summary['planned']} planned, "
        f"{took:.1f} s ({proof}); chosen: {c['change']}, {c['iteration_s']:.3f} s/iter, ${c['usd_per_step']:.4f}/iter\n"
    )
    print("| A100 nodes | V100 nodes | s/iter | $/iter | Pareto |")
    print("|---|---|---|---|---|")
    for r in sorted(summary["rows"], key=lambda r: r.get("iteration_s", 1e9)):
        if "iteration_s" in r:
            n = list(r["counts"].values())
            front = "yes" if r["counts"] in summary["pareto"] else ""
            print(f"| {n[0]} | {n[1]} | {r['iteration_s']:.3f} | ${r['usd_per_step']:.4f} | {front} |")
    Path(args.pareto).write_text(pareto_svg(summary))
    print(f"\nPareto picture: {args.pareto}; load average {os.getloadavg()[0]:.2f} after")


def pool4(args: argparse.Namespace) -> None:
    types = ["A100-40GB", "V100-16GB", "T4", "A10G"]
    profile = _profile(types)
    base = _base([{"name": "b0", **_node("A100-40GB", 8, "600GB/s", 3.74)}])
    prices = {"A100-40GB": 3.74, "V100-16GB": 2.80, "T4": 0.53, "A10G": 1.01}
    pool = {
        "schema": "hetplan/pool/v1",
        "nodes": [{"name": t.lower().split("-")[0], "count": 64, **_node(t, 1, "16GB/s", prices[t])} for t in types],
    }
    space = what_if_space(parse_cluster(base, file="base"), base, parse_pool(pool, file="pool"), ladder=args.ladder)
    opts = PlanOptions(global_batch=args.batch)
    t0 = time.perf_counter()
    c0 = time.process_time()
    result = what_if(profile, space, opts, Objective(args.objective), max_plans=args.max_plans, marginals=False)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    summary = what_if_summary(result)
    c = summary["chosen"]
    print(
        f"`python benchmarks/bench_what_if.py pool4 {' '.join(sys.argv[2:])}`: {summary['candidates']} candidates "
        f"(counts {[k['counts_tried'] for k in summary['kinds']][1:]}), {summary['planned']} planned, "
        f"{'exact' if result.exact else f'stopped, gap {result.gap:.1%}'}, {took:.1f} s ({cpu:.1f} s CPU), "
        f"load average {os.getloadavg()[0]:.2f}; chosen {c['change']}: {c['iteration_s']:.3f} s/iter, "
        f"${c['usd_per_step']:.4f}/iter"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["published", "pool4"])
    parser.add_argument("--objective", default="cheapest-per-step")
    parser.add_argument("--max-plans", type=int, default=None)
    parser.add_argument("--ladder", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--pareto", default=str(Path(tempfile.gettempdir()) / "what-if-pareto.svg"))
    args = parser.parse_args()
    published(args) if args.which == "published" else pool4(args)


if __name__ == "__main__":
    main()

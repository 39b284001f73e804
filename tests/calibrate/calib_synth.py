"""Synthetic measurements: plans simulated on a "true" cluster whose figures differ from the files'.

The truth is made the way calibration applies its own parameters (scaled block times, rewritten
link figures, a collective efficiency), so a calibration that works must find it again.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from builders import make_profile

from hetplan.calibrate.params import Model, candidate_params
from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.runlog import RUNLOG_SCHEMA
from hetplan.contracts.yamlio import write_yaml
from hetplan.simulate import simulate

N_BLOCKS = 6

#: What the synthetic cluster really does, against what its file says: A100s 1.7x and V100s 2.3x
#: slower than profiled, half the stated network bandwidth, all-reduces at 80% of the model's speed.
TRUTH = {
    "compute[A100-80GB]": 1.7,
    "compute[V100-16GB]": 2.3,
    "bandwidth[network]": 5e9,  # the file says 10GB/s
    "collective_efficiency": 0.8,
}

#: Two nodes of two devices each: two device types, an intra-node link per node, one network.
CLUSTER: dict[str, Any] = {
    "schema": "hetplan/cluster/v1",
    "name": "two-types",
    "nodes": [
        {
            "name": "n0",
            "devices": [{"type": "A100-80GB", "count": 2}],
            "link": {"bandwidth": "100GB/s", "latency": "5us"},
        },
        {
            "name": "n1",
            "devices": [{"type": "V100-16GB", "count": 2}],
            "link": {"bandwidth": "50GB/s", "latency": "5us"},
        },
    ],
    "network": {"bandwidth": "10GB/s", "latency": "5us"},
}


def profile(kinds: tuple[str, ...] = ("test",)):
    """Six blocks with round times (A100 twice as fast as V100), big outputs and big gradients, so
    that links and all-reduces are a good part of an iteration. ``kinds`` cycle over the blocks."""
    fast = [(0.002 + 0.0004 * i, 0.004 + 0.0008 * i) for i in range(N_BLOCKS)]
    p = make_profile(
        N_BLOCKS,
        per_block={"A100-80GB": fast, "V100-16GB": [(2 * f, 2 * b) for f, b in fast]},
        params=25_000_000,  # 100 MB of gradients per block
        activation_bytes=1e6,
        output_bytes=100e6,  # 100 MB per sample across a cut
    )
    p.blocks = [replace(b, kind=kinds[i % len(kinds)]) for i, b in enumerate(p.blocks)]
    return p


def uneven_plan() -> Plan:
    """Two pipelines cut differently: a device holds blocks of two gradient groups, so it issues an
    all-reduce part-way through its last backward (the compute beside it is slowed by ``overlap``)."""
    return _plan(
        [
            ([(0, 2, ["n0/0"]), (2, 6, ["n1/0"])], [1, 2]),
            ([(0, 4, ["n0/1"]), (4, 6, ["n1/1"])], [2, 1]),
        ]
    )


def _plan(pipelines: list[tuple[list[tuple[int, int, list[str]]], list[int]]], optimizer: str = "sgd") -> Plan:
    built = []
    for stages, micro in pipelines:
        built.append(
            Pipeline(
                batch=sum(micro),
                micro_batches=tuple(micro),
                stages=tuple(Stage(a, b, tuple(d), tuple(1.0 / len(d) for _ in d)) for a, b, d in stages),
            )
        )
    return Plan(
        global_batch=sum(p.batch for p in built),
        pipelines=built,
        optimizer=optimizer,
        inputs={"profile": {"path": "profile.yaml"}, "cluster": {"path": "cluster.yaml"}},
    )


def plans() -> dict[str, Plan]:
    """Six plans that between them use every device type, both node links, the network and all-reduces."""
    return {
        "pipe-cross": _plan([([(0, 3, ["n0/0"]), (3, 6, ["n1/0"])], [1, 1, 1, 1])]),
        "pipe-n0": _plan([([(0, 2, ["n0/0"]), (2, 6, ["n0/1"])], [2, 2])]),
        "pipe-n1": _plan([([(0, 4, ["n1/0"]), (4, 6, ["n1/1"])], [1, 1, 1])]),
        "dp-cross": _plan([([(0, 6, ["n0/0"])], [2]), ([(0, 6, ["n1/0"])], [1])]),
        "dp-n0": _plan([([(0, 6, ["n0/0"])], [2]), ([(0, 6, ["n0/1"])], [2])]),
        "hybrid": _plan(
            [
                ([(0, 4, ["n0/0"]), (4, 6, ["n1/0"])], [1, 1]),
                ([(0, 4, ["n0/1"]), (4, 6, ["n1/1"])], [1, 1]),
            ]
        ),
    }


def truth_model(prof, raw: dict[str, Any], per_kind: set[str]) -> Model:
    cluster = parse_cluster(copy.deepcopy(raw), file="cluster.yaml", catalog=load_catalog())
    return Model(prof, raw, cluster, load_catalog(), candidate_params(raw, cluster, prof, per_kind=per_kind))


def true_inputs(prof, raw: dict[str, Any], truth: dict[str, float]):
    """The profile and cluster with ``truth`` (parameter name -> value; ``compute[TYPE/KIND]`` for a
    factor per block kind) applied."""
    per_kind = {name[len("compute[") :].split("/")[0] for name in truth if name.startswith("compute[") and "/" in name}
    model = truth_model(prof, raw, per_kind)
    values = {p: truth[p.name] for p in model.params if p.name in truth}
    missing = set(truth) - {p.name for p in values}
    assert not missing, missing
    return model.build(values)


def write_log(path: Path, plan: Plan, sim, steps: int = 4, *, warmup_factor: float = 3.0) -> None:
    """A run log as ``hetplan launch --log`` writes it, every step as simulated (the first slower)."""
    lines = []
    rank = {a: i for i, a in enumerate(plan.all_devices())}
    for step in range(steps):
        slow = warmup_factor if step == 0 else 1.0
        for pi, p in enumerate(plan.pipelines):
            for si, s in enumerate(p.stages):
                for d in s.devices:
                    stats = sim.devices[d]
                    lines.append(
                        json.dumps(
                            {
                                "schema": RUNLOG_SCHEMA,
                                "step": step,
                                "rank": rank[d],
                                "pipeline": pi,
                                "stage": si,
                                "device": d,
                                "iteration_s": sim.iteration_s * slow,
                                "compute_s": stats.compute_s * slow,
                                "wait_s": 0.0,
                                "comm_s": stats.comm_s,
                                "loss": 1.0,
                                "peak_memory_bytes": 1e9,
                            }
                        )
                    )
    path.write_text("\n".join(lines) + "\n")


def write_case(
    folder: Path,
    truth: dict[str, float],
    *,
    names: list[str] | None = None,
    logs: bool = True,
    kinds: tuple[str, ...] = ("test",),
    raw: dict[str, Any] | None = None,
    peak_memory: dict[str, dict[str, float]] | None = None,
    extra: dict[str, Plan] | None = None,
) -> tuple[Path, Path, Path]:
    """Profile, cluster, plans (:func:`plans` and ``extra``), run logs (or measured iteration times)
    and the measurements file."""
    folder.mkdir(parents=True, exist_ok=True)
    raw = copy.deepcopy(raw or CLUSTER)
    prof = profile(kinds)
    prof.save(folder / "profile.yaml")
    write_yaml(raw, folder / "cluster.yaml")
    true_profile, true_cluster = true_inputs(prof, raw, truth)
    runs = []
    for name, plan in (plans() | (extra or {})).items():
        if names is not None and name not in names:
            continue
        plan.save(folder / f"{name}.yaml")
        sim = simulate(plan, true_profile, true_cluster)
        entry: dict[str, Any] = {"plan": f"{name}.yaml"}
        if logs:
            write_log(folder / f"{name}.jsonl", plan, sim)
            entry["run_log"] = f"{name}.jsonl"
        else:
            entry["iteration_s"] = sim.iteration_s
        if peak_memory and name in peak_memory:
            entry["peak_memory"] = peak_memory[name]
        runs.append(entry)
    write_yaml({"schema": "hetplan/measurements/v1", "runs": runs}, folder / "measured.yaml")
    return folder / "profile.yaml", folder / "cluster.yaml", folder / "measured.yaml"

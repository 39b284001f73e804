"""Small exact inputs for tests: a profile with chosen per-block times, a cluster from a dict."""

from __future__ import annotations

from typing import Any

from hetplan.contracts.cluster import Cluster, parse_cluster
from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.contracts.plan import Pipeline, Plan, Stage


def make_profile(
    n_blocks: int,
    *,
    times: dict[str, tuple[float, float]] | None = None,
    per_block: dict[str, list[tuple[float, float]]] | None = None,
    params: int = 0,
    activation_bytes: float = 0.0,
    output_bytes: float = 0.0,
    dtype: str = "fp32",
) -> ModelProfile:
    """Blocks whose time at micro-batch 1 is ``times[device]`` (fwd, bwd), linear in the batch."""
    per_block = per_block or {d: [t] * n_blocks for d, t in (times or {"A100-80GB": (1.0, 2.0)}).items()}
    blocks = []
    for i in range(n_blocks):
        block_times = {d: {1: Timing(fwd=ts[i][0], bwd=ts[i][1], source="estimated")} for d, ts in per_block.items()}
        blocks.append(
            Block(
                name=f"b{i}",
                kind="test",
                params=params,
                param_bytes=float(params * 4),
                activation_bytes=activation_bytes,
                output_bytes=output_bytes,
                flops_fwd=0.0,
                times=block_times,
            )
        )
    return ModelProfile(model={"name": "test"}, dtype=dtype, blocks=blocks)


def make_cluster(
    nodes: list[tuple[str, list[tuple[str, int]]]],
    *,
    intra: Any = "600GB/s",
    inter: Any = "100Gbps",
    intra_latency: Any = 0,
    inter_latency: Any = 0,
    **extra: Any,
) -> Cluster:
    """``[("n0", [("A100-80GB", 2)]), ...]`` as a cluster."""
    data = {
        "schema": "hetplan/cluster/v1",
        "name": "test",
        "nodes": [
            {
                "name": name,
                "devices": [{"type": t, "count": c} for t, c in devices],
                "link": {"bandwidth": intra, "latency": intra_latency},
            }
            for name, devices in nodes
        ],
        "network": {"bandwidth": inter, "latency": inter_latency, **extra},
    }
    return parse_cluster(data, file="test-cluster")


def linear_plan(
    devices: list[str],
    n_blocks: int,
    micro_batches: list[int],
    *,
    schedule: str = "1f1b",
    cuts: list[int] | None = None,
    optimizer: str = "sgd",
) -> Plan:
    """One pipeline, one device per stage, equal cuts unless ``cuts`` are given."""
    p = len(devices)
    cuts = cuts or [round(i * n_blocks / p) for i in range(p + 1)]
    stages = tuple(Stage(cuts[i], cuts[i + 1], (devices[i],), (1.0,)) for i in range(p))
    batch = sum(micro_batches)
    return Plan(
        global_batch=batch,
        pipelines=[Pipeline(batch, tuple(micro_batches), stages)],
        schedule=schedule,
        optimizer=optimizer,
    )


def zoo_profile(model: dict[str, Any], device_type: str = "cpu") -> ModelProfile:
    """A profile of a zoo model with one block per zoo block and placeholder costs: for runtime
    tests, which need the block names (what to build) and not what they cost."""
    from hetplan.models import resolve_model  # torch: only the runtime tests that call this need it

    zoo = resolve_model(model)
    timing = {device_type: {1: Timing(1.0, 1.0)}}
    blocks = [
        Block(name=n, kind="zoo", params=0, param_bytes=0.0, activation_bytes=0.0, output_bytes=0.0,
              flops_fwd=0.0, times=timing)
        for n in zoo.block_names()
    ]  # fmt: skip
    return ModelProfile(model=zoo.model, dtype="fp32", blocks=blocks)


def run_cli(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    """Run ``hetplan ARGV`` in-process: (exit code, stdout, stderr), capsys's earlier output dropped."""
    import pytest

    from hetplan.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else (0 if code is None else 1)), out, err


def write_what_if_inputs(folder: Any) -> dict[str, Any]:
    """A what-if's three files in ``folder``: a 4-block profile timed on A100-40GB and V100-16GB, a
    one-V100 cluster (catalog-priced) and a pool offering one A100-40GB node. Paths by role."""
    import yaml

    profile = make_profile(4, times={"A100-40GB": (0.01, 0.02), "V100-16GB": (0.02, 0.04)}, params=1000)
    profile.save(folder / "p.yaml")
    cluster = {
        "schema": "hetplan/cluster/v1",
        "name": "base",
        "nodes": [{"name": "v0", "devices": [{"type": "V100-16GB"}]}],
        "network": {"bandwidth": "100Gbps"},
    }
    pool = {"schema": "hetplan/pool/v1", "nodes": [{"name": "a100", "count": 1, "devices": [{"type": "A100-40GB"}]}]}
    (folder / "c.yaml").write_text(yaml.safe_dump(cluster))
    (folder / "pool.yaml").write_text(yaml.safe_dump(pool))
    return {"profile": folder / "p.yaml", "cluster": folder / "c.yaml", "pool": folder / "pool.yaml"}

"""Inputs for export tests: a six-layer GPT estimated for A100s and V100s (large enough that an
A100 is the faster at the plans' micro-batch size of 4), a two-node cluster of
three of each, and hand-written plans on them (with their inputs' sha256, as `hetplan plan` writes)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.yamlio import sha256_of
from hetplan.profile.analytic import analytic_profile

CLUSTER = """\
schema: hetplan/cluster/v1
name: two-racks
nodes:
  - name: n0
    devices: [{type: A100-80GB, count: 3}]
    link: {bandwidth: 600GB/s, latency: 2us}
  - name: n1
    devices: [{type: V100-16GB, count: 3}]
    link: {bandwidth: 300GB/s, latency: 2us}
network: {bandwidth: 100Gbps, latency: 10us}
"""

#: Blocks: 0 embedding, layer k = blocks 2k+1 (attn) and 2k+2 (mlp), 13 head.
LAYER_STARTS = (1, 3, 5, 7, 9, 11)
N_BLOCKS = 14


def stage(start: int, end: int, *devices: str, shares: list[float] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"blocks": [start, end], "devices": list(devices)}
    if shares:
        out["shares"] = shares
    return out


def pipeline(batch: int, micro: list[int], *stages: dict[str, Any]) -> dict[str, Any]:
    return {"batch": batch, "micro_batches": micro, "stages": list(stages)}


#: Hand-written plans, each with one feature the uniform runtimes cannot express.
SCENARIOS: dict[str, dict[str, Any]] = {
    "cut_differently": {
        "pipelines": [
            pipeline(16, [4, 4, 4, 4], stage(0, 5, "n0/0"), stage(5, 14, "n1/0")),
            pipeline(16, [4, 4, 4, 4], stage(0, 9, "n0/1"), stage(9, 14, "n1/1")),
        ]
    },
    "unequal_shares": {
        "pipelines": [
            pipeline(20, [4, 4, 4, 4, 4], stage(0, 7, "n0/0"), stage(7, 14, "n1/0")),
            pipeline(12, [4, 4, 4], stage(0, 7, "n0/1"), stage(7, 14, "n1/1")),
        ]
    },
    "replicated_stage": {
        "pipelines": [
            pipeline(16, [4, 4, 4, 4], stage(0, 7, "n0/0"), stage(7, 14, "n1/0", "n1/1", shares=[0.6, 0.4])),
            pipeline(16, [4, 4, 4, 4], stage(0, 7, "n0/1"), stage(7, 14, "n1/2")),
        ]
    },
    "startup_split": {
        "pipelines": [
            pipeline(16, [1, 3, 4, 4, 4], stage(0, 7, "n0/0"), stage(7, 14, "n1/0")),
            pipeline(16, [1, 3, 4, 4, 4], stage(0, 7, "n0/1"), stage(7, 14, "n1/1")),
        ]
    },
    "stage_counts": {
        "pipelines": [
            pipeline(16, [4, 4, 4, 4], stage(0, 7, "n0/0"), stage(7, 14, "n1/0")),
            pipeline(16, [4, 4, 4, 4], stage(0, 5, "n0/1"), stage(5, 9, "n0/2"), stage(9, 14, "n1/1")),
        ]
    },
    "three_stages_gpipe_sgd": {
        "schedule": "gpipe",
        "optimizer": "sgd",
        "pipelines": [
            pipeline(16, [4, 4, 4, 4], stage(0, 3, "n0/0"), stage(3, 9, "n0/1"), stage(9, 14, "n1/0")),
            pipeline(16, [4, 4, 4, 4], stage(0, 3, "n0/2"), stage(3, 9, "n1/1"), stage(9, 14, "n1/2")),
        ],
    },
}

#: The line each scenario must cause (the start of a dropped line), on every runtime.
EXPECTED = {
    "cut_differently": "layer partition (hetplan cuts pipeline 0 at [0, 5, 14]; pipeline 1 at [0, 9, 14])",
    "unequal_shares": "batch shares 20/12",
    "replicated_stage": "stages replicated inside a pipeline (pipeline 0 stage 1 on n1/0, n1/1",
    "startup_split": "micro-batch sizes with startup splitting",
    "stage_counts": "stage counts (pipeline 0: 2, pipeline 1: 3): every ",
    "three_stages_gpipe_sgd": "",  # schedule or optimizer, and device placement: per runtime (test_export.py)
}


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """A folder with ``gpt.yaml`` and ``cluster.yaml``."""
    catalog = load_catalog()
    profile = analytic_profile(
        "gpt",
        {"layers": 6, "hidden": 512, "heads": 8, "seq": 128, "vocab": 1024},
        devices=[catalog.get("A100-80GB"), catalog.get("V100-16GB")],
        micro_batches=(1, 2, 4, 8),
    )
    profile.save(tmp_path / "gpt.yaml")
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    return tmp_path


@pytest.fixture
def write_plan(inputs: Path) -> Callable[..., Path]:
    """``write_plan(name, pipelines=..., schedule=..., optimizer=...)``: a plan file in ``inputs``."""

    def write(name: str, *, pipelines: list[dict[str, Any]], profile: str = "gpt.yaml", **settings: Any) -> Path:
        plan = {
            "schema": "hetplan/plan/v1",
            "inputs": {
                "profile": {"path": profile, "sha256": sha256_of(inputs / profile)},
                "cluster": {"path": "cluster.yaml", "sha256": sha256_of(inputs / "cluster.yaml")},
            },
            "global_batch": sum(p["batch"] for p in pipelines),
            **settings,
            "pipelines": pipelines,
        }
        path = inputs / f"{name}.yaml"
        path.write_text(yaml.safe_dump(plan, sort_keys=False))
        return path

    return write

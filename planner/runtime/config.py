"""Load the rank config (written by ``hetplan emit``) into typed objects the ranks use."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.contracts.catalog import DTYPES
from planner.contracts.fields import Fields
from planner.contracts.plan import PLAN_SCHEMA, Plan, parse_plan
from planner.contracts.yamlio import read_mapping
from planner.errors import HetplanError

__all__ = ["DeviceEntry", "RuntimeConfig", "load_rank_config"]

RANK_CONFIG_SCHEMA = "hetplan/rank-config/v1"


@dataclass(frozen=True)
class DeviceEntry:
    address: str
    node: str
    type: str
    emulated_slowdown: float
    pipeline: int
    stage: int
    start: int
    end: int
    actions: str


@dataclass
class RuntimeConfig:
    model: dict[str, Any]
    n_blocks: int
    plan: Plan
    global_batch: int
    schedule: str
    optimizer: str
    lr: float
    seed: int
    backend: str
    timeout_s: float
    devices: dict[str, DeviceEntry]
    nodes: dict[str, list[str]]
    predicted_iteration_s: float | None
    file: str
    data: str | None = None  # a text file for a character-level language model
    dtype: str = "fp32"  # the plan's compute dtype: fp16/bf16 train with fp32 master weights


def load_rank_config(path: str | Path) -> RuntimeConfig:
    data = read_mapping(path)
    f = Fields(data, file=str(path))
    schema = f.str("schema")
    if schema != RANK_CONFIG_SCHEMA:
        raise f.error(f"expected schema {RANK_CONFIG_SCHEMA}, got {schema!r}", "schema")
    f.raw("tool", None)
    model = f.raw("model")
    if not isinstance(model, dict):
        raise f.error("expected the model section of a profile", "model")
    n_blocks = f.integer("n_blocks", minimum=1)
    t = f.child("training")
    global_batch = t.integer("global_batch", minimum=1)
    schedule = t.str("schedule", choices=("1f1b", "gpipe"))
    optimizer = t.str("optimizer", choices=("sgd", "momentum", "adam"))
    dtype = t.str("dtype", "fp32", choices=DTYPES)
    lr = t.number("lr", positive=True)
    seed = t.integer("seed", minimum=0)
    backend = t.str("backend", choices=("gloo", "nccl"))
    timeout_s = t.number("timeout_s", positive=True)
    text_data = t.str("data", None)
    t.done()
    plan = parse_plan(
        {
            "schema": PLAN_SCHEMA,
            "inputs": {"profile": {"path": "-"}, "cluster": {"path": "-"}},
            "global_batch": global_batch,
            "schedule": schedule,
            "optimizer": optimizer,
            "dtype": dtype,
            "pipelines": f.raw("pipelines"),
        },
        file=str(path),
    )
    f.integer("world_size", minimum=1)
    nodes: dict[str, list[str]] = {}
    for n in f.list("nodes"):
        nodes[n.str("name")] = list(n.list("devices"))
        n.done()
    devices: dict[str, DeviceEntry] = {}
    for d in f.list("devices"):
        blocks = d.list("blocks")
        entry = DeviceEntry(
            address=d.str("address"),
            node=d.str("node"),
            type=d.str("type"),
            emulated_slowdown=d.number("emulated_slowdown", minimum=1.0),
            pipeline=d.integer("pipeline", minimum=0),
            stage=d.integer("stage", minimum=0),
            start=int(blocks[0]),
            end=int(blocks[1]),
            actions=d.str("actions"),
        )
        d.done()
        devices[entry.address] = entry
    predicted = f.raw("predicted", {}) or {}
    f.done()
    if not devices:
        raise HetplanError("no devices", file=str(path), field="devices")
    return RuntimeConfig(
        model=model,
        n_blocks=n_blocks,
        plan=plan,
        global_batch=global_batch,
        schedule=schedule,
        optimizer=optimizer,
        lr=lr,
        seed=seed,
        backend=backend,
        timeout_s=timeout_s,
        devices=devices,
        nodes=nodes,
        predicted_iteration_s=predicted.get("iteration_s"),
        file=str(path),
        data=text_data,
        dtype=dtype,
    )

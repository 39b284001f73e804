"""The rank config: what ``hetplan emit`` writes and every rank reads, a contract like the others.

The writer is :func:`hetplan.emit.rank_config.build_rank_config`; the reader, :func:`load_rank_config`,
is here, beside the one schema constant, so the two sides cannot drift apart. The format:
docs/runtime.md ("What emit writes"). The pipelines are parsed and checked by the plan contract's own
:func:`~hetplan.contracts.plan.parse_pipelines`; the rank config names no profile or cluster file, so
its :class:`Plan` has no ``inputs``.

The ``training`` section's optional keys (absent: today's behaviour): ``optimizer`` may name any
optimizer of :data:`hetplan.contracts.plan.OPTIMIZERS` (``adamw`` included, overriding the plan's),
``weight_decay`` (AdamW only), ``clip_grad_norm`` (the maximum global gradient norm), ``lr_schedule``
(``{warmup_steps, decay_steps, min_lr}``, :mod:`hetplan.contracts.lr_schedule`), ``data`` (a text
file) or ``dataset`` with ``dataset_kwargs`` (a user's ``module:function``,
:mod:`hetplan.runtime.dataset`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import DTYPES
from hetplan.contracts.fields import Fields
from hetplan.contracts.lr_schedule import LrSchedule
from hetplan.contracts.plan import OPTIMIZERS, Plan, parse_pipelines
from hetplan.contracts.yamlio import read_mapping
from hetplan.errors import HetplanError

__all__ = ["RANK_CONFIG_SCHEMA", "DeviceEntry", "RankConfig", "load_rank_config"]

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
class RankConfig:
    """Everything a rank needs: the model, the pipelines (a :class:`Plan` without inputs: the rank
    config carries no profile or cluster), training settings, and each device's place."""

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
    weight_decay: float | None = None  # AdamW's (None: the optimizer's default)
    clip_grad_norm: float | None = None  # the maximum global gradient norm (None: no clipping)
    lr_schedule: LrSchedule | None = None  # None: a constant ``lr``
    dataset: str | None = None  # a user's map-style dataset, ``module:function``
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)

    def lr_by_step(self) -> LrSchedule:
        """The learning rate by step (a constant ``lr`` unless the config gives a schedule)."""
        return self.lr_schedule or LrSchedule(self.lr)


def load_rank_config(path: str | Path) -> RankConfig:
    """Read and check a rank config; one-line errors name the file and the field."""
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
    optimizer = t.str("optimizer", choices=OPTIMIZERS)
    dtype = t.str("dtype", "fp32", choices=DTYPES)
    lr = t.number("lr", positive=True)
    seed = t.integer("seed", minimum=0)
    backend = t.str("backend", choices=("gloo", "nccl"))
    timeout_s = t.number("timeout_s", positive=True)
    text_data = t.str("data", None)
    weight_decay = t.number("weight_decay", None, minimum=0.0)
    if weight_decay is not None and optimizer != "adamw":
        raise t.error(f"weight_decay is AdamW's; this run's optimizer is {optimizer}", "weight_decay")
    clip_grad_norm = t.number("clip_grad_norm", None, positive=True)
    lr_schedule = _lr_schedule(t, lr)
    dataset = t.str("dataset", None)
    dataset_kwargs = dict(t.mapping_items("dataset_kwargs", []))
    if dataset_kwargs and not dataset:
        raise t.error("dataset_kwargs without a dataset", "dataset_kwargs")
    if dataset and text_data:
        raise t.error("give data (a text file) or dataset (a module), not both", "dataset")
    t.done()
    plan = Plan(
        global_batch=global_batch,
        pipelines=parse_pipelines(f, global_batch),
        schedule=schedule,
        dtype=dtype,
        optimizer=optimizer,
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
    return RankConfig(
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
        weight_decay=weight_decay,
        clip_grad_norm=clip_grad_norm,
        lr_schedule=lr_schedule,
        dataset=dataset,
        dataset_kwargs=dataset_kwargs,
    )


def _lr_schedule(t: Fields, lr: float) -> LrSchedule | None:
    """``training.lr_schedule``: warm-up steps, cosine decay steps and the floor (all optional)."""
    s = t.child("lr_schedule", None)
    if s is None:
        return None
    warmup = s.integer("warmup_steps", 0, minimum=0)
    decay = s.integer("decay_steps", 0, minimum=0)
    min_lr = s.number("min_lr", 0.0, minimum=0.0, maximum=lr)
    s.done()
    return LrSchedule(lr=lr, warmup_steps=warmup, decay_steps=decay, min_lr=min_lr)

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
:mod:`hetplan.runtime.dataset`), ``zero`` (the plan's: 0, or 1 for ZeRO-1). A stage's
``tensor_parallel`` and ``recompute`` are keys of its entry in ``pipelines``, read by the plan
contract with the rest of the stage.

The top-level optional ``crossover`` section (absent: the job has its devices to itself) puts the
job in a co-run (:mod:`hetplan.runtime.processes.crossover`): ``turns`` is a folder shared by the jobs that
run on the same devices at once (one lock file per device: a rank holds its device's turn while it
computes), ``job`` this job's name among them, ``ranks`` (optional) the device ranks of all of
them, for which each rank waits before its first step. Format: docs/contracts/rank-config.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import DTYPES
from hetplan.contracts.cluster import Link
from hetplan.contracts.fields import Fields
from hetplan.contracts.lr_schedule import LrSchedule
from hetplan.contracts.plan import OPTIMIZERS, ZERO_STAGES, Plan, parse_pipelines, parse_sync
from hetplan.contracts.yamlio import read_mapping
from hetplan.errors import HetplanError

__all__ = ["RANK_CONFIG_SCHEMA", "Crossover", "DeviceEntry", "RankConfig", "load_rank_config"]

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
    #: emulation only: ``(step, slowdown)`` from which the device runs that much slower than its base
    slowdown_changes: tuple[tuple[int, float], ...] = ()
    #: the device type's memory in bytes (a GPU rank checks its GPU against it); None: not checked
    memory: float | None = None


#: A co-run job's name: it names files (the turn trace), so letters, digits, ``-`` and ``_`` only.
JOB_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class Crossover:
    """The job shares its devices with other jobs running at once (``crossover`` in the file)."""

    #: the folder every co-running job names: ``<address>.lock`` per device (the turn), traces
    turns: str
    #: this job's name among the co-running jobs
    job: str
    #: the device ranks of all co-running jobs: each waits for all before its first step (None: no wait)
    ranks: int | None = None


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
    central_node: str | None = None  # wsp, sdpipe: the node whose agent starts the central process
    #: emulation: the links (node pairs; one node twice for inside it) whose speed the ranks enforce
    emulated_links: dict[frozenset[str], Link] = field(default_factory=dict)
    #: co-run: the per-device turns shared with other jobs on the same devices (None: alone)
    crossover: Crossover | None = None
    #: what the ranks compute on: ``cuda`` or ``cpu`` (None: CUDA under NCCL, the CPU under gloo;
    #: ``cuda`` under gloo is the host-staged transport, :mod:`hetplan.runtime.device.staged`)
    compute_device: str | None = None
    #: a GPU rank whose GPU is not the plan's type goes on (a warning) instead of stopping
    accept_device_mismatch: bool = False
    #: weights to start from instead of the seeded initialisation: a Hugging Face ``save_pretrained``
    #: folder or a state_dict file (:mod:`hetplan.runtime.weights.init_from`); None: the seeded build
    init_from: str | None = None

    def emulated_link(self, a: str, b: str) -> Link | None:
        """The emulated link between devices (or ``central``'s node) ``a`` and ``b``, if any."""
        node_of = {addr: e.node for addr, e in self.devices.items()}
        if self.central_node is not None:
            node_of["central"] = self.central_node
        return self.emulated_links.get(frozenset((node_of[a], node_of[b])))

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
    compute_device = t.str("compute_device", None, choices=("cpu", "cuda"))
    accept_device_mismatch = t.boolean("accept_device_mismatch", False)
    init_from = t.str("init_from", None)
    text_data = t.str("data", None)
    weight_decay = t.number("weight_decay", None, minimum=0.0)
    if weight_decay is not None and optimizer != "adamw":
        raise t.error(f"weight_decay is AdamW's; this run's optimizer is {optimizer}", "weight_decay")
    clip_grad_norm = t.number("clip_grad_norm", None, positive=True)
    lr_schedule = _lr_schedule(t, lr)
    zero = t.integer("zero", 0, minimum=min(ZERO_STAGES), maximum=max(ZERO_STAGES))
    pipelines = parse_pipelines(f, global_batch)
    sync, sync_options = parse_sync(t, pipelines, zero)
    dataset = t.str("dataset", None)
    dataset_kwargs = dict(t.mapping_items("dataset_kwargs", []))
    if dataset_kwargs and not dataset:
        raise t.error("dataset_kwargs without a dataset", "dataset_kwargs")
    if dataset and text_data:
        raise t.error("give data (a text file) or dataset (a module), not both", "dataset")
    t.done()
    plan = Plan(
        global_batch=global_batch,
        pipelines=pipelines,
        schedule=schedule,
        dtype=dtype,
        optimizer=optimizer,
        sync=sync,
        sync_options=sync_options,
        zero=zero,
        file=str(path),
    )
    world_size = f.integer("world_size", minimum=1)
    nodes: dict[str, list[str]] = {}
    for n in f.list("nodes"):
        nodes[n.str("name")] = list(n.list("devices"))
        n.done()
    emulated_links: dict[frozenset[str], Link] = {}
    for i, e in enumerate(f.list("emulated_links", [], non_empty=False)):
        if not isinstance(e, Fields):
            raise f.error("expected {nodes: [A, B], bandwidth, latency}", f"emulated_links[{i}]")
        pair = e.list("nodes")
        if len(pair) != 2 or any(n not in nodes for n in pair):
            raise e.error(f"expected two node names of this rank config, got {pair!r}", "nodes")
        emulated_links[frozenset(pair)] = Link(
            bandwidth=e.number("bandwidth", positive=True), latency=e.number("latency", minimum=0.0), emulated=True
        )
        e.done()
    central = f.child("central", None)
    central_node = None
    if central is not None:
        central_node = central.str("node", choices=tuple(nodes))
        central.done()
    if (central_node is not None) != (sync in ("wsp", "sdpipe")):
        raise f.error(f"sync {sync} {'needs' if central_node is None else 'has no'} central process", "central")
    devices: dict[str, DeviceEntry] = {}
    for d in f.list("devices"):
        blocks = d.list("blocks")
        entry = DeviceEntry(
            address=d.str("address"),
            node=d.str("node"),
            type=d.str("type"),
            emulated_slowdown=d.number("emulated_slowdown", minimum=1.0),
            slowdown_changes=_slowdown_changes(d),
            pipeline=d.integer("pipeline", minimum=0),
            stage=d.integer("stage", minimum=0),
            start=int(blocks[0]),
            end=int(blocks[1]),
            actions=d.str("actions"),
            memory=d.number("memory", None, positive=True),
        )
        d.done()
        devices[entry.address] = entry
    predicted = f.raw("predicted", {}) or {}
    crossover = _crossover(f, Path(path), pipelines)
    f.done()
    if not devices:
        raise HetplanError("no devices", file=str(path), field="devices")
    if world_size != len(devices) + (central_node is not None):
        raise HetplanError(
            f"world_size {world_size}: expected {len(devices)} devices"
            + (" and the central process" if central_node else ""),
            file=str(path),
            field="world_size",
        )
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
        central_node=central_node,
        emulated_links=emulated_links,
        crossover=crossover,
        compute_device=compute_device,
        accept_device_mismatch=accept_device_mismatch,
        init_from=init_from,
    )


def _crossover(f: Fields, path: Path, pipelines: list) -> Crossover | None:
    """``crossover: {turns: FOLDER, job: NAME, ranks: N}``; a relative folder is relative to the file's.

    Tensor-parallel stages are refused: their collectives run inside a forward or backward, so a
    rank would wait for its peers while holding its device's turn, and two jobs each holding one
    device that the other's peer needs would wait for each other for ever.
    """
    c = f.child("crossover", None)
    if c is None:
        return None
    turns = c.str("turns")
    job = c.str("job")
    if not JOB_NAME.fullmatch(job):
        raise c.error(f"expected letters, digits, '-' or '_' (at most 64), got {job!r}", "job")
    ranks = c.integer("ranks", None, minimum=1)
    c.done()
    for i, pipe in enumerate(pipelines):
        for j, stage in enumerate(pipe.stages):
            if stage.tensor_parallel > 1:
                raise f.error(
                    f"pipelines[{i}].stages[{j}] is tensor-parallel: co-running it is not built (its collectives "
                    "run inside compute, which holds the device's turn)",
                    "crossover",
                )
    folder = Path(turns)
    return Crossover(
        turns=str(folder if folder.is_absolute() else path.resolve().parent / folder), job=job, ranks=ranks
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


def _slowdown_changes(d: Fields) -> tuple[tuple[int, float], ...]:
    """A device's ``slowdown_changes``: ``[[step, factor], ...]`` at increasing steps, factors >= 1."""
    out: list[tuple[int, float]] = []
    for i, pair in enumerate(d.list("slowdown_changes", [], non_empty=False)):
        if not isinstance(pair, list) or len(pair) != 2:
            raise d.error(f"expected [step, slowdown], got {pair!r}", f"slowdown_changes[{i}]")
        step = d.check_integer(pair[0], f"slowdown_changes[{i}][0]", minimum=0)
        factor = d.check_number(pair[1], f"slowdown_changes[{i}][1]", minimum=1.0)
        if out and step <= out[-1][0]:
            raise d.error(f"expected increasing steps, got {step} after {out[-1][0]}", f"slowdown_changes[{i}]")
        out.append((step, factor))
    return tuple(out)

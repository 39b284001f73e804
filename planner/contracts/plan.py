"""A plan: pipelines (virtual workers) of stages on devices, with batch shares and micro-batches.

    plan = load_plan("plan.yaml")
    profile, cluster = load_plan_inputs(plan)     # the files it names, resolved beside it
    check_plan(plan, cluster, profile)            # every reference resolves, ranges tile the model

A stage is a half-open block range ``[start, end)`` on one or more devices; several devices make a
replicated stage, each taking ``shares[i]`` of every micro-batch (:func:`split_micro_batch` turns
shares into whole samples, the same way for the simulator and the runtime).

A stage may be tensor-parallel (``tensor_parallel: t``): its devices form replicas of ``t``
consecutive devices (``devices[0:t]``, ``devices[t:2t]``, ...), each replica one Megatron-style
tensor-parallel group that shares one slice of every micro-batch, so ``shares`` has one entry per
replica. ``recompute`` (``none | full | selective``) says what a stage keeps for backward: ``full``
keeps only each block's input and runs the forward again in backward, ``selective`` drops the
attention internals (scores, softmax, dropout mask) and recomputes them. At ``tensor_parallel`` > 1
the zoo GPT's embedding and head are vocabulary-parallel (each member keeps 1/t of the token table,
the LM head and the logits, Megatron's); ``vocab_parallel: false`` keeps them whole on every member
(only ``false`` is written: the default is the plan's choice). The plan-level ``zero: 1``
shards optimizer state (and the fp32 master copy) over the holders of each gradient group. Hand-written plans need
only the minimal keys: ``schema``, ``inputs`` (paths), ``global_batch``, ``pipelines``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetplan import __version__
from hetplan.contracts.catalog import DTYPES
from hetplan.contracts.cluster import Cluster, load_cluster
from hetplan.contracts.fields import Fields
from hetplan.contracts.model_profile import ModelProfile, load_profile
from hetplan.contracts.yamlio import read_mapping, schema_of, sha256_of, write_yaml
from hetplan.errors import HetplanError

__all__ = [
    "OPTIMIZERS",
    "PLAN_SCHEMA",
    "RECOMPUTE",
    "SCHEDULES",
    "SYNC_MODES",
    "SYNC_OPTIONS",
    "ZERO_STAGES",
    "Pipeline",
    "Plan",
    "Stage",
    "check_dtype_supported",
    "check_plan",
    "check_shared_parameters",
    "check_shared_sync",
    "load_plan",
    "load_plan_inputs",
    "parse_pipelines",
    "parse_plan",
    "parse_sync",
    "readable_plan_inputs",
    "split_micro_batch",
]

PLAN_SCHEMA = "hetplan/plan/v1"
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
SCHEDULES = ("1f1b", "gpipe")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
SYNC_MODES = ("allreduce", "wsp", "sdpipe", "adasum", "topk")
#: Each sync mode's options (``sync_options``) with their defaults; a mode takes only its own.
SYNC_OPTIONS: dict[str, dict[str, float | int]] = {
    "allreduce": {},
    "wsp": {"staleness": 0, "wave": 1},  # HetPipe: waves of ``wave`` iterations, at most ``staleness`` ahead
    "sdpipe": {"group_size": 2},  # pipelines averaged together per round, grouped by progress
    "adasum": {},
    "topk": {"ratio": 0.01},  # fraction of each gradient group's entries sent per step
}
RECOMPUTE = ("none", "full", "selective")
ZERO_STAGES = (0, 1)


def split_micro_batch(size: int, shares: tuple[float, ...]) -> tuple[int, ...]:
    """Whole samples per replica for a micro-batch of ``size`` split by ``shares``.

    Largest-remainder rounding, ties to the lower index: deterministic, sums to ``size``, and
    every replica's count is within one sample of ``size * share``.
    """
    if len(shares) == 1:
        return (size,)
    total = sum(shares)
    exact = [size * s / total for s in shares]
    counts = [int(x) for x in exact]
    left = size - sum(counts)
    order = sorted(range(len(shares)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return tuple(counts)


@dataclass(frozen=True)
class Stage:
    """Blocks ``[start, end)`` on ``devices``; ``shares`` of each micro-batch per replica.

    A replica is ``tensor_parallel`` consecutive devices (one device when 1); ``recompute`` is what
    the stage recomputes in backward (``none``, ``full`` or ``selective``).
    """

    start: int
    end: int
    devices: tuple[str, ...]
    shares: tuple[float, ...]
    tensor_parallel: int = 1
    recompute: str = "none"
    #: at tensor_parallel > 1: the zoo GPT's embedding and head cut by vocabulary rows (Megatron's)
    vocab_parallel: bool = True

    @property
    def replicated(self) -> bool:
        """More than one replica: the stage is data-parallel inside its pipeline."""
        return len(self.devices) > self.tensor_parallel

    @property
    def replicas(self) -> tuple[tuple[str, ...], ...]:
        """The tensor-parallel groups, in order: ``devices`` cut into runs of ``tensor_parallel``."""
        t = self.tensor_parallel
        return tuple(self.devices[i : i + t] for i in range(0, len(self.devices), t))

    def share_of(self, device: str) -> float:
        """The share of each micro-batch ``device``'s replica takes."""
        return self.shares[self.devices.index(device) // self.tensor_parallel]

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"blocks": [self.start, self.end], "devices": list(self.devices)}
        if self.tensor_parallel > 1:
            out["tensor_parallel"] = self.tensor_parallel
        if self.replicated:
            out["shares"] = list(self.shares)
        if self.recompute != "none":
            out["recompute"] = self.recompute
        if self.tensor_parallel > 1 and not self.vocab_parallel:
            out["vocab_parallel"] = False
        return out


@dataclass(frozen=True)
class Pipeline:
    """One virtual worker: a batch share, its micro-batch sizes (in order), its stages."""

    batch: int
    micro_batches: tuple[int, ...]
    stages: tuple[Stage, ...]

    def devices(self) -> list[str]:
        return [d for s in self.stages for d in s.devices]

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "micro_batches": list(self.micro_batches),
            "stages": [s.to_dict() for s in self.stages],
        }


@dataclass
class Plan:
    """Settings, pipelines, and what the planner predicted (see DESIGN.md, 'Plan')."""

    global_batch: int
    pipelines: list[Pipeline]
    schedule: str = "1f1b"
    dtype: str | None = None  # None: the profile's dtype
    optimizer: str = "adam"
    sync: str = "allreduce"
    sync_options: dict[str, float | int] = field(default_factory=dict)  # the mode's, defaults filled in
    zero: int = 0  # 1: optimizer state (and fp32 master weights) sharded over each group's holders
    inputs: dict[str, dict[str, str]] = field(default_factory=dict)
    tool: dict[str, str] = field(default_factory=lambda: {"name": "hetplan", "version": __version__})
    predicted: dict[str, Any] = field(default_factory=dict)
    baselines: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    file: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": PLAN_SCHEMA, "tool": dict(self.tool)}
        if self.inputs:
            out["inputs"] = self.inputs
        out["global_batch"] = self.global_batch
        if self.dtype:
            out["dtype"] = self.dtype
        out["optimizer"] = self.optimizer
        out["schedule"] = self.schedule
        out["sync"] = self.sync
        if self.sync_options:
            out["sync_options"] = dict(self.sync_options)
        if self.zero:
            out["zero"] = self.zero
        out["pipelines"] = [p.to_dict() for p in self.pipelines]
        if self.predicted:
            out["predicted"] = self.predicted
        if self.baselines:
            out["baselines"] = self.baselines
        if self.details:
            out["details"] = self.details
        return out

    def save(self, path: str | Path) -> None:
        write_yaml(self.to_dict(), path)

    def sync_option(self, key: str) -> float | int:
        """One of the sync mode's options: the plan's, else the mode's default."""
        return self.sync_options.get(key, SYNC_OPTIONS[self.sync][key])

    def all_devices(self) -> list[str]:
        return [d for p in self.pipelines for d in p.devices()]


def _parse_stage(s: Fields) -> Stage:
    rng = s.list("blocks")
    if len(rng) != 2:
        raise s.error("expected a half-open block range [start, end]", "blocks")
    start = s.check_integer(rng[0], "blocks[0]", minimum=0)
    end = s.check_integer(rng[1], "blocks[1]", minimum=1)
    if end <= start:
        raise s.error(f"expected start < end, got [{start}, {end}]", "blocks")
    devices = s.list("devices")
    for i, d in enumerate(devices):
        if not isinstance(d, str) or "/" not in d:
            raise s.error(f"expected a device address NODE/INDEX, got {d!r}", f"devices[{i}]")
    if len(set(devices)) != len(devices):
        raise s.error("a device appears twice in one stage", "devices")
    tp = s.integer("tensor_parallel", 1, minimum=1)
    if len(devices) % tp:
        raise s.error(
            f"{len(devices)} devices do not form replicas of tensor_parallel {tp} (consecutive groups of {tp})",
            "tensor_parallel",
        )
    replicas = len(devices) // tp
    if s.has("shares"):
        shares = s.list("shares")
        if len(shares) != replicas:
            each = "one per device" if tp == 1 else f"one per replica of {tp} devices"
            raise s.error(f"expected {replicas} shares ({each}), got {len(shares)}", "shares")
        values = tuple(s.check_number(v, f"shares[{i}]", positive=True) for i, v in enumerate(shares))
        if abs(sum(values) - 1.0) > 1e-6:
            raise s.error(f"shares must sum to 1, got {sum(values):.6g}", "shares")
    else:
        values = tuple(1.0 / replicas for _ in range(replicas))
    recompute = s.str("recompute", "none", choices=RECOMPUTE)
    vocab_parallel = s.boolean("vocab_parallel", True)
    s.done()
    return Stage(
        start=start,
        end=end,
        devices=tuple(devices),
        shares=values,
        tensor_parallel=tp,
        recompute=recompute,
        vocab_parallel=vocab_parallel,
    )


def parse_sync(f: Fields, pipelines: list[Pipeline], zero: int) -> tuple[str, dict[str, float | int]]:
    """``sync`` and ``sync_options`` of a plan (or a rank config's training section), checked
    against the pipelines and ``zero``."""
    sync = f.str("sync", "allreduce", choices=SYNC_MODES)
    _check_sync_combinations(f, sync, zero, pipelines)
    return sync, _sync_options(f, sync)


def _check_sync_combinations(f: Fields, sync: str, zero: int, pipelines: list[Pipeline]) -> None:
    """What a sync mode cannot be combined with (each refusal says why)."""
    if zero and sync != "allreduce":
        raise f.error(f"zero: 1 shards the all-reduce's state; sync {sync} combines gradients otherwise", "zero")
    if sync in ("adasum", "wsp", "sdpipe"):
        for pi, p in enumerate(pipelines):
            for si, s in enumerate(p.stages):
                if s.tensor_parallel > 1:
                    raise f.error(
                        f"sync {sync} works on whole tensors; pipelines[{pi}].stages[{si}] is tensor-parallel",
                        "sync",
                    )
    if sync == "sdpipe":
        shape = [(s.start, s.end, len(s.devices)) for s in pipelines[0].stages]
        for pi, p in enumerate(pipelines[1:], start=1):
            if [(s.start, s.end, len(s.devices)) for s in p.stages] != shape:
                raise f.error(
                    f"sync sdpipe averages each device with its counterparts: pipelines[{pi}] must have the "
                    "stages (blocks and device counts) of pipelines[0]",
                    "sync",
                )


def _sync_options(f: Fields, sync: str) -> dict[str, float | int]:
    """``sync_options``: only the keys ``sync`` uses, each checked; the mode's defaults filled in."""
    defaults = SYNC_OPTIONS[sync]
    o = f.child("sync_options", None)
    if o is None:
        return dict(defaults)
    out: dict[str, float | int] = {}
    for key, default in defaults.items():
        if key == "ratio":
            value = o.number(key, default, positive=True, maximum=1.0)
        elif key == "group_size":
            value = o.integer(key, default, minimum=2)
        else:
            value = o.integer(key, default, minimum=1 if key == "wave" else 0)
        out[key] = value
    extra = sorted(str(k) for k in set(o.data) - set(defaults))
    if extra:
        used = ", ".join(defaults) or "no options"
        raise o.error(f"sync mode {sync} takes {used}, not {', '.join(extra)}", extra[0])
    o.done()
    return out


def _optional_mapping(f: Fields, key: str) -> dict[str, Any]:
    """A free-form section the planner writes (``predicted``, ...): absent or null is empty."""
    value = f.raw(key, None)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise f.error(f"expected a mapping, got {type(value).__name__} {value!r}", key)
    return value


def _predicted(f: Fields) -> dict[str, Any]:
    """The ``predicted`` section; the figures other tools and ``show`` read must be numbers."""
    section = _optional_mapping(f, "predicted")
    sub = f.sub("predicted", section)
    for key in ("iteration_s", "samples_per_s", "bubble_fraction"):
        if key in section:
            sub.check_number(section[key], key, minimum=0.0)
    for key in ("stages", "memory"):
        if key in section and not isinstance(section[key], (list, dict)):
            raise sub.error(f"expected a {'list' if key == 'stages' else 'mapping'}, got {section[key]!r}", key)
    return section


def parse_pipelines(f: Fields, global_batch: int) -> list[Pipeline]:
    """The ``pipelines`` section of a plan or a rank config: stages tile the model from block 0,
    batches sum to ``global_batch``, every pipeline ends at the same block, no device twice."""
    pipelines: list[Pipeline] = []
    for p in f.list("pipelines"):
        if not isinstance(p, Fields):
            raise f.error("expected each pipeline to be a mapping {batch, micro_batches, stages}", "pipelines")
        batch = p.integer("batch", minimum=1)
        sizes = p.list("micro_batches")
        micro = tuple(p.check_integer(v, f"micro_batches[{i}]", minimum=1) for i, v in enumerate(sizes))
        if sum(micro) != batch:
            raise p.error(
                f"micro-batch sizes sum to {sum(micro)}, expected the pipeline's batch {batch}", "micro_batches"
            )
        stages = []
        for s in p.list("stages"):
            if not isinstance(s, Fields):
                raise p.error("expected each stage to be a mapping {blocks, devices}", "stages")
            stages.append(_parse_stage(s))
        for i in range(1, len(stages)):
            if stages[i].start != stages[i - 1].end:
                gap = "a gap" if stages[i].start > stages[i - 1].end else "an overlap"
                raise p.error(
                    f"stage {i} starts at block {stages[i].start} but stage {i - 1} ends at "
                    f"{stages[i - 1].end} ({gap})",
                    f"stages[{i}].blocks",
                )
        if stages[0].start != 0:
            raise p.error(f"the first stage must start at block 0, got {stages[0].start}", "stages[0].blocks")
        p.done()
        pipelines.append(Pipeline(batch=batch, micro_batches=micro, stages=tuple(stages)))
    if sum(p.batch for p in pipelines) != global_batch:
        raise f.error(
            f"pipeline batches sum to {sum(p.batch for p in pipelines)}, expected global_batch {global_batch}",
            "pipelines",
        )
    ends = {p.stages[-1].end for p in pipelines}
    if len(ends) != 1:
        raise f.error(f"pipelines end at different blocks {sorted(ends)}; each must cover the whole model", "pipelines")
    degree_of: dict[int, tuple[int, bool, str]] = {}
    for pi, p in enumerate(pipelines):
        for si, st in enumerate(p.stages):
            vp = st.vocab_parallel or st.tensor_parallel == 1
            for b in range(st.start, st.end):
                t, v, where = degree_of.setdefault(b, (st.tensor_parallel, vp, f"pipelines[{pi}].stages[{si}]"))
                if t != st.tensor_parallel:
                    raise f.error(
                        f"block {b} is tensor_parallel {st.tensor_parallel} here but {t} in {where}: every holder "
                        "of a block uses one degree (their gradient shards all-reduce together)",
                        f"pipelines[{pi}].stages[{si}].tensor_parallel",
                    )
                if v != vp:
                    raise f.error(
                        f"block {b} is vocab_parallel {str(vp).lower()} here but {str(v).lower()} in {where}: every "
                        "holder of a block cuts it alike",
                        f"pipelines[{pi}].stages[{si}].vocab_parallel",
                    )
    seen: dict[str, str] = {}
    for pi, p in enumerate(pipelines):
        for si, s in enumerate(p.stages):
            for d in s.devices:
                if d in seen:
                    raise f.error(
                        f"device {d} is used twice (also in {seen[d]})", f"pipelines[{pi}].stages[{si}].devices"
                    )
                seen[d] = f"pipelines[{pi}].stages[{si}]"
    return pipelines


def parse_plan(data: dict[str, Any], *, file: str | None = None) -> Plan:
    """Build a :class:`Plan` from a parsed mapping; checks what needs no other file."""
    f = Fields(data, file=file)
    schema = f.str("schema")
    if schema != PLAN_SCHEMA:
        raise f.error(f"expected schema {PLAN_SCHEMA}, got {schema!r}", "schema")
    tool = f.raw("tool", {"name": "hetplan", "version": __version__})
    inputs_f = f.child("inputs")
    inputs: dict[str, dict[str, str]] = {}
    for key in ("profile", "cluster"):
        entry = inputs_f.child(key)
        item = {"path": entry.str("path")}
        sha = entry.str("sha256", None)
        if sha is not None:
            if not _SHA256.fullmatch(sha):
                raise entry.error(f"expected 64 hex digits (the file's sha256), got {sha!r}", "sha256")
            item["sha256"] = sha
        entry.done()
        inputs[key] = item
    inputs_f.done()
    global_batch = f.integer("global_batch", minimum=1)
    pipelines = parse_pipelines(f, global_batch)
    zero = f.integer("zero", 0, minimum=min(ZERO_STAGES), maximum=max(ZERO_STAGES))
    sync, sync_options = parse_sync(f, pipelines, zero)
    plan = Plan(
        global_batch=global_batch,
        pipelines=pipelines,
        schedule=f.str("schedule", "1f1b", choices=SCHEDULES),
        dtype=f.str("dtype", None, choices=DTYPES),
        optimizer=f.str("optimizer", "adam", choices=OPTIMIZERS),
        sync=sync,
        sync_options=sync_options,
        zero=zero,
        inputs=inputs,
        tool=tool if isinstance(tool, dict) else {"name": str(tool)},
        predicted=_predicted(f),
        baselines=_optional_mapping(f, "baselines"),
        details=_optional_mapping(f, "details"),
        file=file,
    )
    f.done()
    return plan


def load_plan(path: str | Path) -> Plan:
    """Load and validate a plan file (on its own; see :func:`check_plan` for its inputs)."""
    data = read_mapping(path)
    schema_of(data, path)
    return parse_plan(data, file=str(path))


def _input_path(plan: Plan, key: str) -> Path:
    raw = Path(plan.inputs[key]["path"])
    if raw.is_absolute() or plan.file is None:
        return raw
    return Path(plan.file).parent / raw


def load_plan_inputs(
    plan: Plan, *, profile: str | Path | None = None, cluster: str | Path | None = None, strict: bool = True
) -> tuple[ModelProfile, Cluster]:
    """Load the profile and cluster a plan names (or the given overrides), checking their sha256.

    A file whose digest differs from the one recorded means the plan was made for other inputs:
    with ``strict`` that is an error naming the field, since simulating or launching it would be
    silently wrong. An override is another file on purpose, so its digest is not compared (the plan
    is still checked against it by :func:`check_plan`).
    """
    overridden = {"profile": profile is not None, "cluster": cluster is not None}
    paths = {
        "profile": Path(profile) if profile else _input_path(plan, "profile"),
        "cluster": Path(cluster) if cluster else _input_path(plan, "cluster"),
    }
    for key, path in paths.items():
        if not path.is_file():
            raise HetplanError(
                f"the {key} file {str(path)!r} does not exist", file=plan.file, field=f"inputs.{key}.path"
            )
        recorded = plan.inputs.get(key, {}).get("sha256")
        if strict and recorded and not overridden[key] and sha256_of(path) != recorded:
            raise HetplanError(
                f"{path} has changed since the plan was made (sha256 differs); re-run 'hetplan plan'",
                file=plan.file,
                field=f"inputs.{key}.sha256",
            )
    loaded_profile = load_profile(paths["profile"])
    loaded_cluster = load_cluster(paths["cluster"])
    return loaded_profile, loaded_cluster


def readable_plan_inputs(plan: Plan) -> tuple[ModelProfile, Cluster] | None:
    """The profile and cluster the plan names, or None where they cannot be read (moved, edited):
    for what only adds to a view of the plan (``show --json``'s band), not for what needs them."""
    if not {"profile", "cluster"} <= set(plan.inputs or {}):
        return None
    try:
        return load_plan_inputs(plan)
    except (HetplanError, OSError):
        return None


def check_plan(plan: Plan, cluster: Cluster, profile: ModelProfile) -> None:
    """Check a plan against its cluster and profile: devices exist, ranges tile the model, times exist."""
    n = len(profile.blocks)
    served: set[tuple] = set()  # (type, blocks, degree) already found to have times: a 512-device plan asks often
    for pi, p in enumerate(plan.pipelines):
        if p.stages[-1].end != n:
            raise HetplanError(
                f"the last stage ends at block {p.stages[-1].end} but the profile has {n} blocks",
                file=plan.file,
                field=f"pipelines[{pi}].stages[{len(p.stages) - 1}].blocks",
            )
        for si, s in enumerate(p.stages):
            for di, address in enumerate(s.devices):
                device = cluster.device(address, file=plan.file, field=f"pipelines[{pi}].stages[{si}].devices[{di}]")
                key = (device.type.name, s.start, s.end, s.tensor_parallel)
                if key in served:
                    continue
                if s.tensor_parallel > 1 and all(
                    s.tensor_parallel in profile.tp_degrees(b, device.type) for b in range(s.start, min(s.end, n))
                ):
                    served.add(key)
                    continue  # times at the stage's degree serve it (a profile may have no degree-1 times)
                try:
                    profile.time_scale(device.type)
                    served.add(key)
                except HetplanError as exc:
                    # the plan put this device here, so the plan's field is where to look
                    where = f" {profile.file}" if profile.file else ""
                    raise HetplanError(
                        f"device {address} is a {device.type.name}: {exc.reason} (profile{where})",
                        file=plan.file,
                        field=f"pipelines[{pi}].stages[{si}].devices[{di}]",
                    ) from None
            for group in s.replicas if s.tensor_parallel > 1 else ():
                members = [cluster.device(a) for a in group]
                if len({(d.node, d.type.name) for d in members}) > 1:
                    raise HetplanError(
                        f"tensor-parallel group {', '.join(group)} spans "
                        f"{', '.join(sorted({f'{d.node} {d.type.name}' for d in members}))}: a group must be "
                        "devices of one type on one node (its all-reduces run every layer)",
                        file=plan.file,
                        field=f"pipelines[{pi}].stages[{si}].devices",
                    )
    if plan.dtype and plan.dtype != profile.dtype:
        raise HetplanError(
            f"plan dtype {plan.dtype} differs from the profile's {profile.dtype}", file=plan.file, field="dtype"
        )
    check_shared_parameters(plan, profile)
    check_dtype_supported(cluster, plan.dtype or profile.dtype, plan.all_devices(), file=plan.file, field="dtype")


def check_shared_parameters(plan: Plan, profile: ModelProfile) -> None:
    """Refuse what the runtime cannot do with the profile's shared (tied) parameters: shard their
    optimizer state (ZeRO-1), sync them by a mode that does not sum gradients, or hold them at two
    tensor-parallel degrees (:func:`hetplan.runtime.parallel.tied.check_tied_plan` says the same at
    run time; here a plan is refused before it is timed)."""
    if not profile.shared:
        return
    names = ", ".join(entry.name for entry in profile.shared)
    if plan.zero == 1:
        raise HetplanError(
            f"the profile shares parameters ({names}); ZeRO-1 does not support that yet, plan with zero: 0",
            file=plan.file,
            field="zero",
        )
    check_shared_sync(profile, plan.sync, file=plan.file, field="sync")
    if "family" not in profile.model and any(s.tensor_parallel > 1 for p in plan.pipelines for s in p.stages):
        raise HetplanError(
            f"the profile shares parameters ({names}); tensor parallelism supports that for zoo models only yet",
            file=plan.file,
            field="pipelines",
        )
    for entry in profile.shared:
        cuts = {
            (s.tensor_parallel, s.vocab_parallel or s.tensor_parallel == 1)
            for p in plan.pipelines
            for s in p.stages
            if entry.held_by(s.start, s.end)
        }
        if len(cuts) > 1:
            seen = ", ".join(f"{t}" + ("" if v else " (vocab_parallel false)") for t, v in sorted(cuts))
            raise HetplanError(
                f"shared parameter {entry.name} is held at tensor-parallel degrees {seen}: every holder "
                "needs one degree and one cut",
                file=plan.file,
                field="pipelines",
            )


def check_shared_sync(profile: ModelProfile, sync: str, *, file: str | None, field: str) -> None:
    """Refuse a sync mode that does not sum a shared (tied) parameter's gradients over its holders
    (only ``allreduce`` does): a plan's, or the one a search is asked for."""
    if profile.shared and sync != "allreduce":
        names = ", ".join(entry.name for entry in profile.shared)
        raise HetplanError(
            f"the profile shares parameters ({names}); sync {sync} does not sum their gradients, use allreduce",
            file=file,
            field=field,
        )


def check_dtype_supported(
    cluster: Cluster, dtype: str, addresses: list[str] | None = None, *, file: str | None, field: str
) -> None:
    """Refuse a dtype that a device of ``addresses`` (default: every device) cannot run natively:
    bf16 on a V100, T4, Turing card or P100 would run emulated, far slower than any time in the
    profile, and its numerics are not what the user asked for."""
    devices = [cluster.device(a) for a in addresses] if addresses is not None else list(cluster.devices)
    for device in devices:
        if not device.type.supports(dtype):
            native = ", ".join(sorted({"fp32", *device.type.peak}))
            raise HetplanError(
                f"{device.address} is a {device.type.name}, which cannot run {dtype} natively (it runs "
                f"{native}); profile and plan for one of those, or leave the {device.type.name}s out",
                file=file,
                field=field,
            )

"""A model as hetplan sees it: an ordered list of blocks with their costs.

    profile = load_profile("gpt.profile.yaml")
    profile.blocks[3].output_bytes            # bytes per sample sent to block 4
    profile.block_time(3, device_type, 6)     # (fwd_s, bwd_s) at micro-batch 6, interpolated
    profile.tp_degrees(3)                     # (1, 2, 4): the tensor-parallel degrees block 3 has
    profile.block_time(3, device_type, 6, tp=2)   # compute only, per device, at degree 2
    profile.shard(3, 2).params                # parameters each of the 2 devices holds
    profile.recompute_time(3, device_type, 6, tp=2)   # seconds to redo what selective recompute drops

Times are seconds per micro-batch at a few measured (or estimated) micro-batch sizes. Between two
sizes the time is interpolated linearly; above the largest it grows in proportion to the batch
(the device is saturated there); below the smallest it shrinks in proportion too, which is
optimistic (small batches run below peak), so profiles should include micro-batch 1. An emulated
device type without times of its own takes its base type's times multiplied by its slowdown.

Tensor parallelism (optional, per block; docs/contracts/model-profile.md): a block may carry
``tensor_parallel: {t: {...}}`` for degrees t >= 2, each with what one of the t devices holds and
does in a Megatron-style split (Shoeybi et al. 2019): ``params`` (and ``param_bytes``) per device,
``activation_bytes`` per device per sample, ``allreduce_bytes`` per sample (the all-reduce at the
block's end, once in forward and once in backward), ``selective_bytes`` and ``time`` as below, and
``allreduce_in_time: true`` where the times were measured with that all-reduce inside them (then
the cost model does not add it again). A degree is available for a block only where it has one;
degree 1 is the block itself. A degree's ``time`` may cover fewer device types than degree 1 (an
imported file need not have measured every type at every degree).

Selective recomputation (Korthikanti et al. 2022): ``selective_bytes`` is the part of
``activation_bytes`` (per sample) that selective recomputation drops (the attention internals:
scores, softmax output, dropout mask and output), and each timing's optional ``recompute`` is the
forward seconds of recomputing it at that micro-batch (the attention core's kernels). A block with
``selective_bytes`` but no ``recompute`` time is charged its whole forward (conservative).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import DTYPE_BYTES, DTYPES, DeviceType
from hetplan.contracts.fields import Fields
from hetplan.contracts.yamlio import read_mapping, schema_of, write_yaml
from hetplan.errors import HetplanError

__all__ = [
    "PROFILE_SCHEMA",
    "TIME_SOURCES",
    "Block",
    "ModelProfile",
    "Shard",
    "SharedParams",
    "TensorParallel",
    "Timing",
    "load_profile",
    "parse_profile",
]

PROFILE_SCHEMA = "hetplan/model-profile/v1"
#: ``calibrated``: a time rescaled by ``hetplan calibrate`` to fit measured runs (docs/calibration.md).
TIME_SOURCES = ("measured", "estimated", "imported", "calibrated")


@dataclass(frozen=True)
class Timing:
    """Forward and backward seconds of one block at one micro-batch size on one device type."""

    fwd: float
    bwd: float
    source: str = "measured"
    spread: float | None = None  # relative spread of repeated measurements (max-min)/median
    recompute: float | None = None  # forward seconds to recompute what selective recompute drops

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fwd": self.fwd, "bwd": self.bwd}
        if self.recompute is not None:
            out["recompute"] = self.recompute
        out["source"] = self.source
        if self.spread is not None:
            out["spread"] = self.spread
        return out


def _times_dict(times: dict[str, dict[int, Timing]]) -> dict[str, Any]:
    return {device: {m: t.to_dict() for m, t in sorted(by_size.items())} for device, by_size in times.items()}


@dataclass(frozen=True)
class TensorParallel:
    """One block at tensor-parallel degree ``t`` (>= 2): what each of its ``t`` devices holds and does."""

    params: int  # per device: the sharded matrices / t plus what every device keeps whole
    param_bytes: float
    activation_bytes: float  # per device, per sample, kept for backward
    allreduce_bytes: float  # per sample: the block's all-reduce, once in forward and once in backward
    times: dict[str, dict[int, Timing]] = field(default_factory=dict)  # compute only, per device
    selective_bytes: float = 0.0  # per device, per sample: what selective recomputation drops
    allreduce_in_time: bool = False  # the times were measured with the all-reduce inside them

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "params": self.params,
            "param_bytes": self.param_bytes,
            "activation_bytes": self.activation_bytes,
            "allreduce_bytes": self.allreduce_bytes,
        }
        if self.selective_bytes:
            out["selective_bytes"] = self.selective_bytes
        if self.allreduce_in_time:
            out["allreduce_in_time"] = True
        out["time"] = _times_dict(self.times)
        return out


@dataclass(frozen=True)
class Shard:
    """What one device of a block's tensor-parallel group holds, at one degree (1: the whole block)."""

    tp: int
    params: int
    param_bytes: float
    activation_bytes: float
    selective_bytes: float
    allreduce_bytes: float  # 0 at degree 1
    allreduce_in_time: bool = False


@dataclass(frozen=True)
class Block:
    """One partition unit: takes one tensor, returns one tensor."""

    name: str
    kind: str
    params: int
    param_bytes: float
    activation_bytes: float  # per sample, kept for backward
    output_bytes: float  # per sample, sent to the next block
    flops_fwd: float  # per sample
    times: dict[str, dict[int, Timing]] = field(default_factory=dict)
    selective_bytes: float = 0.0  # per sample: the part of activation_bytes selective recompute drops
    tensor_parallel: dict[int, TensorParallel] = field(default_factory=dict)  # degree (>= 2) -> data

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "params": self.params,
            "param_bytes": self.param_bytes,
            "activation_bytes": self.activation_bytes,
            "output_bytes": self.output_bytes,
            "flops_fwd": self.flops_fwd,
        }
        if self.selective_bytes:
            out["selective_bytes"] = self.selective_bytes
        out["time"] = _times_dict(self.times)
        if self.tensor_parallel:
            out["tensor_parallel"] = {t: data.to_dict() for t, data in sorted(self.tensor_parallel.items())}
        return out

    def shard(self, tp: int = 1) -> Shard:
        """This block's per-device figures at degree ``tp`` (KeyError where it has no such degree)."""
        if tp == 1:
            return Shard(1, self.params, self.param_bytes, self.activation_bytes, self.selective_bytes, 0.0)
        d = self.tensor_parallel[tp]
        return Shard(
            tp, d.params, d.param_bytes, d.activation_bytes, d.selective_bytes, d.allreduce_bytes, d.allreduce_in_time
        )

    def times_at(self, tp: int = 1) -> dict[str, dict[int, Timing]]:
        """The block's times at degree ``tp`` (KeyError where it has no such degree)."""
        return self.times if tp == 1 else self.tensor_parallel[tp].times


@dataclass(frozen=True)
class SharedParams:
    """Parameters several blocks hold (an LM head tied to the token embedding, a layer used twice):
    listed once in the profile, the blocks' own ``params`` not counting them (DESIGN.md, "Shared
    (tied) parameters"). Every device holding one of ``blocks`` keeps a copy (the runtime's
    :mod:`hetplan.runtime.parallel.tied`): its weights, gradient and optimizer state, once however
    many of the holders it has; the copies' gradients are summed over every holder at the step."""

    name: str
    params: int
    param_bytes: float
    blocks: tuple[int, ...]  # the holders, ascending
    # degree -> (params, param_bytes) one member of a degree-t group keeps (a vocabulary-parallel
    # tied table: 1/t of its rows); a degree not listed keeps the whole of it on every member
    tensor_parallel: dict[int, tuple[int, float]] = field(default_factory=dict)

    def at(self, tp: int = 1) -> tuple[int, float]:
        """(params, param_bytes) one member of a degree-``tp`` group holds."""
        return self.tensor_parallel.get(tp, (self.params, self.param_bytes))

    def held_by(self, start: int, end: int) -> bool:
        """Whether a stage of blocks ``[start, end)`` holds a copy."""
        return any(start <= b < end for b in self.blocks)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "params": self.params,
            "param_bytes": self.param_bytes,
            "blocks": list(self.blocks),
        }
        if self.tensor_parallel:
            out["tensor_parallel"] = {
                t: {"params": p, "param_bytes": b} for t, (p, b) in sorted(self.tensor_parallel.items())
            }
        return out


def _interpolate(points: dict[int, Timing], m: float) -> tuple[float, float]:
    sizes = sorted(points)
    if m <= 0:
        return 0.0, 0.0
    if m <= sizes[0]:
        t = points[sizes[0]]
        return t.fwd * m / sizes[0], t.bwd * m / sizes[0]
    if m >= sizes[-1]:
        t = points[sizes[-1]]
        return t.fwd * m / sizes[-1], t.bwd * m / sizes[-1]
    hi = bisect.bisect_left(sizes, m)
    m0, m1 = sizes[hi - 1], sizes[hi]
    t0, t1 = points[m0], points[m1]
    w = (m - m0) / (m1 - m0)
    return t0.fwd + w * (t1.fwd - t0.fwd), t0.bwd + w * (t1.bwd - t0.bwd)


def _interpolate_recompute(points: dict[int, Timing], m: float) -> float:
    """The ``recompute`` seconds at ``m``, read as :func:`_interpolate` reads ``fwd`` (a point
    without one counts its whole forward)."""
    as_fwd = {size: Timing(t.fwd if t.recompute is None else t.recompute, 0.0) for size, t in points.items()}
    return _interpolate(as_fwd, m)[0]


@dataclass
class ModelProfile:
    """Identity, dtype and blocks of a model; see the module docstring for how times are read."""

    model: dict[str, Any]
    dtype: str
    blocks: list[Block]
    input_bytes: float = 0.0  # per sample, the batch fed to block 0
    source: dict[str, Any] = field(default_factory=dict)
    file: str | None = None
    shared: list[SharedParams] = field(default_factory=list)  # parameters several blocks hold

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def total_params(self) -> int:
        """Every parameter of the model once: the blocks' own and each shared entry."""
        return sum(b.params for b in self.blocks) + sum(s.params for s in self.shared)

    def block_params(self, index: int, tp: int = 1) -> tuple[float, float]:
        """(params, param_bytes) one member of block ``index`` at degree ``tp`` holds with the
        shared entries it is a holder of: the count a framework building that block alone sees
        (DeepSpeed's per-layer count, the analytic costs), not a stage's (:meth:`shared_held`)."""
        own = self.shard(index, tp)
        params, weights = self.shared_held(index, index + 1, tp)
        return own.params + params, own.param_bytes + weights

    def shared_held(self, start: int, end: int, tp: int = 1) -> tuple[float, float]:
        """(params, param_bytes) of the shared parameters one member of a degree-``tp`` stage of
        blocks ``[start, end)`` keeps beside its blocks' own: each entry it holds a block of, once."""
        params = weights = 0.0
        for entry in self.shared:
            if entry.held_by(start, end):
                p, w = entry.at(tp)
                params += p
                weights += w
        return params, weights

    def device_types(self) -> list[str]:
        """Device type names that every block has times for, in first-seen order."""
        names: list[str] = []
        for name in self.blocks[0].times if self.blocks else []:
            if all(name in b.times for b in self.blocks):
                names.append(name)
        return names

    def _times_key(self, device: DeviceType) -> str | None:
        if self.blocks and all(device.name in b.times for b in self.blocks):
            return device.name
        for alias in device.aliases:
            if all(alias in b.times for b in self.blocks):
                return alias
        return None

    def tp_degrees(self, index: int, device: DeviceType | None = None) -> tuple[int, ...]:
        """Tensor-parallel degrees block ``index`` has, ascending, always with 1; with ``device``,
        only those with times for it (degree 1 is kept: :meth:`time_scale` says where it lacks them)."""
        block = self.blocks[index]
        degrees = sorted(block.tensor_parallel)
        if device is not None:
            degrees = [t for t in degrees if self._tp_key(block.tensor_parallel[t].times, device) is not None]
        return (1, *degrees)

    def shard(self, index: int, tp: int = 1) -> Shard:
        """Per-device figures of block ``index`` at degree ``tp``; a degree it lacks is an error."""
        block = self.blocks[index]
        if tp != 1 and tp not in block.tensor_parallel:
            raise HetplanError(
                f"block {block.name!r} has no tensor-parallel degree {tp} (it has: "
                f"{', '.join(map(str, self.tp_degrees(index)))}); profile it at that degree",
                file=self.file,
                field=f"blocks[{index}].tensor_parallel",
            )
        return block.shard(tp)

    @staticmethod
    def _tp_key(times: dict[str, dict[int, Timing]], device: DeviceType) -> tuple[str, float] | None:
        """The key of ``times`` that serves ``device`` and the factor on it (one block, one degree)."""
        for name in (device.name, *device.aliases):
            if name in times:
                return name, 1.0
        if device.emulated and device.emulates is not None and device.emulates in times:
            return device.emulates, device.slowdown
        return None

    def _points(self, index: int, device: DeviceType, tp: int) -> tuple[dict[int, Timing], float]:
        """The timed points of block ``index`` at degree ``tp`` for ``device``, and the factor on them."""
        if tp == 1:
            key, scale = self.time_scale(device)
            return self.blocks[index].times[key], scale
        times = self.blocks[index].times_at(tp) if tp in self.blocks[index].tensor_parallel else None
        found = self._tp_key(times, device) if times is not None else None
        if times is None or found is None:
            self.shard(index, tp)  # a missing degree says so
            have = ", ".join(times or {}) or "none"
            raise HetplanError(
                f"block {self.blocks[index].name!r} has no times for {device.name} at tensor-parallel degree {tp} "
                f"(it has: {have})",
                file=self.file,
                field=f"blocks[{index}].tensor_parallel.{tp}.time",
            )
        return times[found[0]], found[1]

    def time_scale(self, device: DeviceType) -> tuple[str, float]:
        """The profile key whose times serve ``device``, and the factor to multiply them by."""
        key = self._times_key(device)
        if key is not None:
            return key, 1.0
        if device.emulated and device.emulates is not None:
            base_key = next((n for n in self.device_types() if n == device.emulates), None)
            if base_key is not None:
                return base_key, device.slowdown
        have = ", ".join(self.device_types()) or "none"
        wanted = device.emulates if device.emulated else device.name
        raise HetplanError(
            f"the profile has no times for device type {wanted!r} (it has: {have}); {self._how_to_add(wanted)}",
            file=self.file,
            field="blocks[].time",
        )

    def _how_to_add(self, wanted: str) -> str:
        """The ``hetplan profile`` option that gives this profile times for ``wanted``: ``--devices``
        only exists for analytic profiles; a measured one carries its times with ``--estimate-for``."""
        timings = [t for b in self.blocks for by_size in b.times.values() for t in by_size.values()]
        if self.source.get("tool") == "hetplan analytic":
            return f"profile with --analytic --devices {wanted}"
        if self.source.get("tool") == "hetplan measure" or any(t.source == "measured" for t in timings):
            return f"profile again with --estimate-for {wanted} (the measured times, carried to {wanted})"
        return f"profile with --estimate-for {wanted} (measured) or --analytic --devices {wanted} (estimated)"

    def block_time(self, index: int, device: DeviceType, m: float, tp: int = 1) -> tuple[float, float]:
        """(forward, backward) seconds of block ``index`` at micro-batch ``m`` on ``device``; at
        ``tp`` >= 2 the compute of one device of the group (its all-reduces are the cost model's)."""
        points, scale = self._points(index, device, tp)
        fwd, bwd = _interpolate(points, m)
        return fwd * scale, bwd * scale

    def recompute_time(self, index: int, device: DeviceType, m: float, tp: int = 1) -> float:
        """Forward seconds to recompute what selective recomputation drops from block ``index``
        (0 for a block that drops nothing)."""
        if self.shard(index, tp).selective_bytes <= 0:
            return 0.0
        points, scale = self._points(index, device, tp)
        return _interpolate_recompute(points, m) * scale

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": PROFILE_SCHEMA, "model": self.model, "dtype": self.dtype}
        if self.input_bytes:
            out["input_bytes"] = self.input_bytes
        if self.source:
            out["source"] = self.source
        out["blocks"] = [b.to_dict() for b in self.blocks]
        if self.shared:
            out["shared"] = [entry.to_dict() for entry in self.shared]
        return out

    def save(self, path: str | Path) -> None:
        write_yaml(self.to_dict(), path)


def _parse_times(f: Fields) -> dict[str, dict[int, Timing]]:
    times: dict[str, dict[int, Timing]] = {}
    for device, by_size in f.mapping_items("time", {}):
        where = f"time.{device}"
        if not isinstance(device, str):
            raise f.error("device type names must be strings", where)
        sizes = f.sub(where, by_size)
        points: dict[int, Timing] = {}
        for m, value in sizes.data.items():
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise f.error(f"micro-batch sizes must be positive integers, got {m!r}", where)
            t = sizes.sub(m, value)
            timing = Timing(
                fwd=t.number("fwd", minimum=0.0),
                bwd=t.number("bwd", minimum=0.0),
                source=t.str("source", "measured", choices=TIME_SOURCES),
                spread=t.number("spread", None, minimum=0.0),
                recompute=t.number("recompute", None, minimum=0.0),
            )
            t.done()
            points[m] = timing
        if not points:
            raise f.error("expected at least one micro-batch size", where)
        times[device] = points
    return times


def _selective_bytes(f: Fields, activation_bytes: float) -> float:
    value = f.number("selective_bytes", 0.0, minimum=0.0)
    if value > activation_bytes:
        raise f.error(
            f"selective recomputation cannot drop {value:g} bytes of the {activation_bytes:g} the block keeps",
            "selective_bytes",
        )
    return value


def _degrees(f: Fields) -> list[tuple[int, Fields]]:
    """``f``'s ``tensor_parallel: {t: {...}}`` entries: each degree (an integer >= 2) and its fields."""
    out = []
    for degree, value in f.mapping_items("tensor_parallel", {}):
        if isinstance(degree, bool) or not isinstance(degree, int) or degree < 2:
            raise f.error(f"tensor-parallel degrees must be integers >= 2, got {degree!r}", "tensor_parallel")
        out.append((degree, Fields(value, file=f.file, path=f"{f.where('tensor_parallel')}.{degree}")))
    return out


def _parse_tensor_parallel(b: Fields, params: int) -> dict[int, TensorParallel]:
    """A block's ``tensor_parallel: {t: {...}}``: degrees >= 2, each with its per-device figures."""
    out: dict[int, TensorParallel] = {}
    for degree, d in _degrees(b):
        shard_params = d.integer("params", minimum=0)
        if shard_params > params:
            raise d.error(f"a device of the group cannot hold more than the block's {params} parameters", "params")
        activation = d.number("activation_bytes", minimum=0.0)
        entry = TensorParallel(
            params=shard_params,
            param_bytes=d.number("param_bytes", minimum=0.0),
            activation_bytes=activation,
            allreduce_bytes=d.number("allreduce_bytes", minimum=0.0),
            selective_bytes=_selective_bytes(d, activation),
            allreduce_in_time=d.boolean("allreduce_in_time", False),
            times=_parse_times(d),
        )
        if not entry.times:
            raise d.error("expected times for at least one device type", "time")
        d.done()
        out[degree] = entry
    return dict(sorted(out.items()))


def parse_profile(data: dict[str, Any], *, file: str | None = None) -> ModelProfile:
    """Build a :class:`ModelProfile` from a parsed mapping, checking every field."""
    f = Fields(data, file=file)
    schema = f.str("schema")
    if schema != PROFILE_SCHEMA:
        raise f.error(f"expected schema {PROFILE_SCHEMA}, got {schema!r}", "schema")
    model = f.child("model")
    if not (model.has("family") or model.has("factory") or model.has("hf") or model.has("name")):
        raise model.error("expected 'family' (a zoo model), 'factory' (module:function), 'hf' (transformers) or 'name'")
    for key in ("family", "factory", "hf", "name"):
        model.str(key, None)
    seq = model.raw("seq", None)  # a Hugging Face model's tokens per sample
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 1):
        raise model.error(f"expected a positive number of tokens, got {seq!r}", "seq")
    config = model.raw("config", {})
    if not isinstance(config, dict):
        raise model.error("expected a mapping of the model's settings", "config")
    shape = model.raw("input_shape", None)  # a module:factory model's per-sample input shape
    if shape is not None and (
        not isinstance(shape, list)
        or not shape
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in shape)
    ):
        raise model.error(f"expected a list of positive integers such as [3, 224, 224], got {shape!r}", "input_shape")
    model.done()
    dtype = f.str("dtype", choices=DTYPES)
    dtype_bytes = DTYPE_BYTES[dtype]
    input_bytes = f.number("input_bytes", 0.0, minimum=0.0)
    source = f.raw("source", {})
    if not isinstance(source, dict):
        raise f.error("expected a mapping describing where the numbers came from", "source")
    blocks: list[Block] = []
    names: set[str] = set()
    for b in f.list("blocks"):
        if not isinstance(b, Fields):
            raise f.error("expected each block to be a mapping", "blocks")
        name = b.str("name")
        if name in names:
            raise b.error(f"duplicate block name {name!r}", "name")
        names.add(name)
        params = b.integer("params", minimum=0)
        activation = b.number("activation_bytes", minimum=0.0)
        block = Block(
            name=name,
            kind=b.str("kind", "block"),
            params=params,
            param_bytes=b.number("param_bytes", float(params * dtype_bytes), minimum=0.0),
            activation_bytes=activation,
            output_bytes=b.number("output_bytes", minimum=0.0),
            flops_fwd=b.number("flops_fwd", 0.0, minimum=0.0),
            times=_parse_times(b),
            selective_bytes=_selective_bytes(b, activation),
            tensor_parallel=_parse_tensor_parallel(b, params),
        )
        b.done()
        blocks.append(block)
    shared = _parse_shared(f, blocks, dtype_bytes)
    f.done()
    profile = ModelProfile(
        model=dict(model.data),
        dtype=dtype,
        blocks=blocks,
        input_bytes=input_bytes,
        source=source,
        file=file,
        shared=shared,
    )
    _check_times_complete(profile, f)
    return profile


def _parse_shared(f: Fields, blocks: list[Block], dtype_bytes: int) -> list[SharedParams]:
    """``shared: [{name, params, blocks: [i, j], param_bytes?, tensor_parallel?: {t: {params,
    param_bytes?}}}]``: each entry's holders are block indices, at least two, each listed once; a
    block may hold several entries, an entry's name is unique."""
    out: list[SharedParams] = []
    names: set[str] = set()
    for k, item in enumerate(f.list("shared", [], non_empty=False)):
        if not isinstance(item, Fields):
            raise f.error("expected each shared entry to be a mapping {name, params, blocks}", f"shared[{k}]")
        name = item.str("name")
        if name in names:
            raise item.error(f"duplicate shared parameter name {name!r}", "name")
        names.add(name)
        params = item.integer("params", minimum=0)
        holders = item.raw("blocks")
        if (
            not isinstance(holders, list)
            or not all(isinstance(b, int) and not isinstance(b, bool) for b in holders)
            or len(holders) < 2
            or len(set(holders)) != len(holders)
        ):
            raise item.error(f"expected two or more distinct block indices, got {holders!r}", "blocks")
        for b in holders:
            if not 0 <= b < len(blocks):
                raise item.error(f"block {b} does not exist (the profile has blocks 0 to {len(blocks) - 1})", "blocks")
        degrees: dict[int, tuple[int, float]] = {}
        for degree, d in _degrees(item):
            member = d.integer("params", minimum=0)
            if member > params:
                raise d.error(f"a member cannot hold more than the entry's {params} parameters", "params")
            degrees[degree] = (member, d.number("param_bytes", float(member * dtype_bytes), minimum=0.0))
            d.done()
        out.append(
            SharedParams(
                name=name,
                params=params,
                param_bytes=item.number("param_bytes", float(params * dtype_bytes), minimum=0.0),
                blocks=tuple(sorted(holders)),
                tensor_parallel=dict(sorted(degrees.items())),
            )
        )
        item.done()
    return out


def _check_times_complete(profile: ModelProfile, f: Fields) -> None:
    """Every block must have times for the same device types: a gap would be a silent zero."""
    first = set(profile.blocks[0].times)
    for i, block in enumerate(profile.blocks):
        missing = first - set(block.times)
        extra = set(block.times) - first
        if missing or extra:
            what = f"no times for {sorted(missing)}" if missing else f"times for {sorted(extra)} that block 0 lacks"
            raise f.error(
                f"block {block.name!r} has {what}; every block needs the same device types", f"blocks[{i}].time"
            )


def load_profile(path: str | Path) -> ModelProfile:
    """Load and validate a model profile file."""
    data = read_mapping(path)
    schema_of(data, path)
    return parse_profile(data, file=str(path))

"""A model as hetplan sees it: an ordered list of blocks with their costs.

    profile = load_profile("gpt.profile.yaml")
    profile.blocks[3].output_bytes            # bytes per sample sent to block 4
    profile.block_time(3, device_type, 6)     # (fwd_s, bwd_s) at micro-batch 6, interpolated

Times are seconds per micro-batch at a few measured (or estimated) micro-batch sizes. Between two
sizes the time is interpolated linearly; above the largest it grows in proportion to the batch
(the device is saturated there); below the smallest it shrinks in proportion too, which is
optimistic (small batches run below peak), so profiles should include micro-batch 1. An emulated
device type without times of its own takes its base type's times multiplied by its slowdown.
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

__all__ = ["PROFILE_SCHEMA", "TIME_SOURCES", "Block", "ModelProfile", "Timing", "load_profile", "parse_profile"]

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

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fwd": self.fwd, "bwd": self.bwd, "source": self.source}
        if self.spread is not None:
            out["spread"] = self.spread
        return out


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "params": self.params,
            "param_bytes": self.param_bytes,
            "activation_bytes": self.activation_bytes,
            "output_bytes": self.output_bytes,
            "flops_fwd": self.flops_fwd,
            "time": {
                device: {m: t.to_dict() for m, t in sorted(by_size.items())} for device, by_size in self.times.items()
            },
        }


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


@dataclass
class ModelProfile:
    """Identity, dtype and blocks of a model; see the module docstring for how times are read."""

    model: dict[str, Any]
    dtype: str
    blocks: list[Block]
    input_bytes: float = 0.0  # per sample, the batch fed to block 0
    source: dict[str, Any] = field(default_factory=dict)
    file: str | None = None

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

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
            f"the profile has no times for device type {wanted!r} (it has: {have}); profile with --devices {wanted}",
            file=self.file,
            field="blocks[].time",
        )

    def block_time(self, index: int, device: DeviceType, m: float) -> tuple[float, float]:
        """(forward, backward) seconds of block ``index`` at micro-batch ``m`` on ``device``."""
        key, scale = self.time_scale(device)
        fwd, bwd = _interpolate(self.blocks[index].times[key], m)
        return fwd * scale, bwd * scale

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema": PROFILE_SCHEMA, "model": self.model, "dtype": self.dtype}
        if self.input_bytes:
            out["input_bytes"] = self.input_bytes
        if self.source:
            out["source"] = self.source
        out["blocks"] = [b.to_dict() for b in self.blocks]
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
            )
            t.done()
            points[m] = timing
        if not points:
            raise f.error("expected at least one micro-batch size", where)
        times[device] = points
    return times


def parse_profile(data: dict[str, Any], *, file: str | None = None) -> ModelProfile:
    """Build a :class:`ModelProfile` from a parsed mapping, checking every field."""
    f = Fields(data, file=file)
    schema = f.str("schema")
    if schema != PROFILE_SCHEMA:
        raise f.error(f"expected schema {PROFILE_SCHEMA}, got {schema!r}", "schema")
    model = f.child("model")
    if not (model.has("family") or model.has("factory") or model.has("name")):
        raise model.error("expected 'family' (a zoo model), 'factory' (module:function) or 'name'")
    for key in ("family", "factory", "name"):
        model.str(key, None)
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
        block = Block(
            name=name,
            kind=b.str("kind", "block"),
            params=params,
            param_bytes=b.number("param_bytes", float(params * dtype_bytes), minimum=0.0),
            activation_bytes=b.number("activation_bytes", minimum=0.0),
            output_bytes=b.number("output_bytes", minimum=0.0),
            flops_fwd=b.number("flops_fwd", 0.0, minimum=0.0),
            times=_parse_times(b),
        )
        b.done()
        blocks.append(block)
    f.done()
    profile = ModelProfile(
        model=dict(model.data), dtype=dtype, blocks=blocks, input_bytes=input_bytes, source=source, file=file
    )
    _check_times_complete(profile, f)
    return profile


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

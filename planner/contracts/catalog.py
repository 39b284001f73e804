"""The device catalog: what each GPU type can do (peak dense FLOP/s per dtype, memory, bandwidth).

    catalog = load_catalog()                  # the bundled profiles/devices.yaml
    a100 = catalog.get("A100-80GB")
    a100.peak_flops("bf16")                   # 312e12

Cluster files may add types inline (``spec:``) or as an *emulated* type (``emulate:``): a base type
slowed down by a stated factor, used to run heterogeneous plans on one machine. An emulated type
is always labelled as such (:attr:`DeviceType.emulated`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from pathlib import Path

from planner.contracts.fields import Fields
from planner.contracts.paths import bundled_profiles_dir
from planner.contracts.yamlio import read_mapping, schema_of
from planner.errors import HetplanError

__all__ = ["DTYPES", "DTYPE_BYTES", "Catalog", "DeviceType", "load_catalog", "parse_device_spec"]

CATALOG_SCHEMA = "hetplan/devices/v1"

#: Compute dtypes a profile or plan may name, with their storage size in bytes.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)

# Where a catalog lacks a dtype, the nearest one it runs at (tf32 math falls back to fp32, bf16
# on a pre-Ampere GPU is emulated at no better than fp32 rate; fp16 without tensor cores likewise).
_DTYPE_FALLBACK = {"tf32": "fp32", "bf16": "fp32", "fp16": "fp32"}


@dataclass(frozen=True)
class DeviceType:
    """One accelerator type. Rates in base units: FLOP/s, bytes, bytes/s."""

    name: str
    memory: float
    memory_bandwidth: float
    peak: dict[str, float] = field(default_factory=dict)
    vendor: str = ""
    aliases: tuple[str, ...] = ()
    emulates: str | None = None
    slowdown: float = 1.0

    @property
    def emulated(self) -> bool:
        """True when this type is a base type slowed down on purpose (single-machine demos)."""
        return self.emulates is not None

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s at ``dtype`` (falling back to fp32 where the type lacks it)."""
        if dtype in self.peak:
            return self.peak[dtype]
        fallback = _DTYPE_FALLBACK.get(dtype)
        if fallback and fallback in self.peak:
            return self.peak[fallback]
        raise HetplanError(f"device type {self.name} has no peak FLOP/s for {dtype}")

    def label(self) -> str:
        """Name as shown to people; emulated types say so."""
        if self.emulated:
            speed = "at full speed" if self.slowdown == 1.0 else f"{self.slowdown:g}x slower"
            return f"{self.name} (emulated: {self.emulates} {speed})"
        return self.name


def _parse_peak(f: Fields, key: str) -> dict[str, float]:
    peak: dict[str, float] = {}
    for dtype, value in f.mapping_items(key):
        if dtype not in DTYPE_BYTES:
            raise f.error(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}", f"{key}.{dtype}")
        peak[dtype] = f.check_number(value, f"{key}.{dtype}", positive=True) * 1e12
    if not peak:
        raise f.error("expected at least one dtype, for example {fp32: 19.5}", key)
    return peak


def parse_device_spec(name: str, f: Fields) -> DeviceType:
    """A full device description: ``memory``, ``memory_bandwidth``, ``tflops: {dtype: TFLOP/s}``."""
    device = DeviceType(
        name=name,
        memory=f.bytes("memory"),
        memory_bandwidth=f.bandwidth("memory_bandwidth"),
        peak=_parse_peak(f, "tflops"),
        vendor=f.str("vendor", ""),
        aliases=tuple(f.list("aliases", [], non_empty=False)),
    )
    for i, alias in enumerate(device.aliases):
        if not isinstance(alias, str) or not alias:
            raise f.error("expected a non-empty string", f"aliases[{i}]")
    f.raw("source", None)  # a citation; kept in the file, not needed by the planner
    f.done()
    return device


class Catalog:
    """Device types by name (and alias)."""

    def __init__(self, types: dict[str, DeviceType], *, file: str | None = None) -> None:
        self.types = dict(types)
        self.file = file
        self._by_alias: dict[str, str] = {}
        for device in types.values():
            for alias in device.aliases:
                self._by_alias[alias] = device.name

    def __contains__(self, name: object) -> bool:
        return name in self.types or name in self._by_alias

    def __iter__(self):
        return iter(self.types.values())

    def __len__(self) -> int:
        return len(self.types)

    def canonical(self, name: str) -> str | None:
        """The catalog name for ``name`` or one of its aliases; None if unknown."""
        if name in self.types:
            return name
        return self._by_alias.get(name)

    def get(self, name: str, *, file: str | None = None, field: str | None = None) -> DeviceType:
        """The type called ``name``; an unknown name is a located error with a suggestion."""
        canonical = self.canonical(name)
        if canonical is None:
            raise HetplanError(f"unknown device type {name!r}{self._hint(name)}", file=file, field=field)
        return self.types[canonical]

    def _hint(self, name: str) -> str:
        """A suggestion for an unknown name: same letters in another case, a longer name it starts, a
        near spelling (aliases included), or else the list of types."""
        text = str(name)
        names = list(self.types) + sorted(self._by_alias)
        same_case = [n for n in names if n.lower() == text.lower()]
        if same_case:
            return f"; did you mean '{same_case[0]}'?"
        longer = [n for n in self.types if text and n.lower().startswith(text.lower())]
        if len(longer) == 1:
            return f"; did you mean '{longer[0]}'?"
        if longer:
            return f"; did you mean one of {', '.join(longer)}?"
        close = difflib.get_close_matches(text, names, n=1)
        if close:
            return f"; did you mean '{close[0]}'?"
        return f"; known: {', '.join(self.types)}"

    def with_types(self, extra: dict[str, DeviceType]) -> Catalog:
        """A catalog that also knows ``extra`` (inline and emulated types of a cluster)."""
        merged = dict(self.types)
        merged.update(extra)
        return Catalog(merged, file=self.file)


def parse_emulated(name: str, f: Fields, catalog: Catalog) -> DeviceType:
    """``emulate: {base: cpu, slowdown: 2.0, memory?: 4GiB}``: a base type run slower on purpose."""
    base_name = f.str("base")
    base = catalog.get(base_name, file=f.file, field=f.where("base"))
    slowdown = f.number("slowdown", positive=True)
    if slowdown < 1.0:
        raise f.error(
            f"expected a slowdown >= 1 (an emulated device cannot be faster than its base), got {slowdown:g}",
            "slowdown",
        )
    memory = f.bytes("memory", base.memory)
    f.done()
    return replace(
        base,
        name=name,
        memory=memory,
        peak={k: v / slowdown for k, v in base.peak.items()},
        memory_bandwidth=base.memory_bandwidth / slowdown,
        aliases=(),
        # an emulated type of an emulated type is the root type slowed by both factors
        emulates=base.emulates or base.name,
        slowdown=slowdown * base.slowdown,
    )


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load a device catalog (default: the bundled ``profiles/devices.yaml``)."""
    source = Path(path) if path is not None else bundled_profiles_dir() / "devices.yaml"
    data = read_mapping(source)
    f = Fields(data, file=str(source))
    schema = schema_of(data, source)
    if schema != CATALOG_SCHEMA:
        raise f.error(f"expected schema {CATALOG_SCHEMA}, got {schema!r}", "schema")
    f.raw("schema")
    types: dict[str, DeviceType] = {}
    for name, spec in f.mapping_items("devices"):
        if not isinstance(name, str):
            raise f.error("device type names must be strings", f"devices.{name}")
        types[name] = parse_device_spec(name, f.sub(f"devices.{name}", spec))
    f.done()
    if not types:
        raise f.error("expected at least one device type", "devices")
    catalog = Catalog(types, file=str(source))
    seen: dict[str, str] = {}
    for device in types.values():
        for alias in device.aliases:
            if alias in types or alias in seen:
                raise HetplanError(
                    f"alias {alias!r} is used twice", file=str(source), field=f"devices.{device.name}.aliases"
                )
            seen[alias] = device.name
    return catalog

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

from hetplan.contracts.fields import Fields
from hetplan.contracts.paths import bundled_profiles_dir
from hetplan.contracts.prices import Price, parse_price
from hetplan.contracts.yamlio import read_mapping, schema_of
from hetplan.errors import HetplanError

__all__ = [
    "BACKENDS",
    "DEFAULT_FRAGMENTATION",
    "DTYPES",
    "DTYPE_BYTES",
    "AchievedEfficiency",
    "Catalog",
    "DeviceType",
    "default_backends",
    "default_reserve",
    "load_catalog",
    "parse_device_spec",
]

CATALOG_SCHEMA = "hetplan/devices/v1"

#: Compute dtypes a profile or plan may name, with their storage size in bytes.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)

#: Generic reserve for a type that states none: 1 GiB, or 10% of a small device's memory.
_GENERIC_RESERVE_BYTES = 1.0 * 2**30
_GENERIC_RESERVE_FRACTION = 0.10
#: PyTorch's caching allocator typically loses a few percent of the allocated bytes to fragmentation
#: in steady-state training (docs/cost-model.md, Memory): 5% unless a type states otherwise.
DEFAULT_FRAGMENTATION = 0.05


def default_reserve(memory: float) -> float:
    """The generic reserve: 1 GiB, or 10% of a small device's memory, whichever is smaller."""
    return min(_GENERIC_RESERVE_BYTES, _GENERIC_RESERVE_FRACTION * memory)


@dataclass(frozen=True)
class AchievedEfficiency:
    """What real kernels reach on one device type, as fractions of its data-sheet peaks.

    A peak is an upper bound nobody trains at; these figures turn it into an honest estimate
    (docs/estimates.md; the model that uses them is :mod:`hetplan.profile.efficiency`). Each bundled
    figure cites its source in profiles/devices.yaml.

    gemm: per dtype, the fraction of that dtype's peak a cuBLAS-class GEMM sustains at training
        shapes once it fills the GPU. A dtype the type lacks runs at the fp32 rate and uses the
        fp32 figure.
    attention: the fraction *of the gemm figure* that the batched score and context matmuls of
        attention reach (one small matmul per head, inner or outer size = head dim 64-128).
    memory: the fraction of memory bandwidth that elementwise, norm and softmax kernels reach.
    launch_s: seconds added per kernel (host dispatch plus launch).
    sms: streaming multiprocessors: a GEMM fills the GPU once it has about this many output tiles.
    """

    gemm: dict[str, float]
    attention: float
    memory: float
    launch_s: float
    sms: int

    def gemm_fraction(self, dtype: str) -> float | None:
        """The stated GEMM figure for ``dtype`` (bf16 shares fp16's when only that is stated)."""
        if dtype in self.gemm:
            return self.gemm[dtype]
        if dtype == "bf16" and "fp16" in self.gemm:
            return self.gemm["fp16"]
        return None

    def to_dict(self) -> dict[str, object]:
        """Plain values, as recorded in a profile's ``source``."""
        return {
            "gemm": dict(self.gemm),
            "attention": self.attention,
            "memory": self.memory,
            "launch_s": self.launch_s,
            "sms": self.sms,
        }


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
    #: Emulated types only: ``(step, slowdown)`` from which the slowdown changes while a job runs
    #: (:class:`hetplan.contracts.emulation.SlowdownSchedule`); the planner plans for ``slowdown``.
    slowdown_changes: tuple[tuple[int, float], ...] = ()
    #: Bytes a training process cannot use for tensors: the CUDA context, cuBLAS/cuDNN workspaces,
    #: NCCL's buffers and the gap between the marketed and the driver-reported capacity. None:
    #: the generic rule of :func:`default_reserve` (catalog entries state their own, with a source).
    reserve: float | None = None
    #: Fraction of the tensor bytes lost to the caching allocator's fragmentation (blocks split and
    #: cached but not reusable for the next request size); tensors x (1 + this) must fit.
    fragmentation: float = DEFAULT_FRAGMENTATION
    #: Achieved fractions of the peaks per kind of work (docs/estimates.md); None: the generic
    #: figures of :mod:`hetplan.profile.efficiency`, used for inline types that state none.
    efficiency: AchievedEfficiency | None = None
    #: torch.distributed backends the type runs (``nccl`` is RCCL on a ROCm build of torch);
    #: stated per entry, else :func:`default_backends` of the vendor.
    backends: tuple[str, ...] = ("gloo",)
    #: USD per GPU-hour with its source and date (``price:`` in the catalog); None: not priced, so
    #: plans on it show no $/step (a cluster file's per-node ``price_per_hour`` overrides it).
    price: Price | None = None
    #: Seconds every forward and every backward call of a stage costs on top of its blocks' times
    #: (the module call, autograd's graph set-up, the schedule's bookkeeping): what makes micro-batches
    #: of 1-2 samples slower than their kernels (``overhead: {micro_batch: 50us}``; docs/cost-model.md,
    #: "Overheads"). Calibratable per type.
    micro_batch_s: float = 0.0
    #: Factor (>= 1) on compute time while a collective of the same device runs beside it: NCCL's
    #: kernels take SMs and memory bandwidth (``overhead: {overlap_slowdown: 1.1}``; docs/cost-model.md,
    #: "Overlap"). Calibratable per type.
    overlap_slowdown: float = 1.0

    def math_dtype(self, dtype: str) -> str:
        """The dtype whose peak ``dtype`` math actually runs at here (``peak_flops``'s fallback)."""
        if dtype in self.peak:
            return dtype
        fallback = _DTYPE_FALLBACK.get(dtype)
        if fallback and fallback in self.peak:
            return fallback
        raise HetplanError(f"device type {self.name} has no peak FLOP/s for {dtype}")

    @property
    def reserve_bytes(self) -> float:
        """The stated reserve, or the generic rule for a type that states none."""
        return self.reserve if self.reserve is not None else default_reserve(self.memory)

    def fits(self, tensor_bytes: float) -> bool:
        """Whether ``tensor_bytes`` of live tensors fit: tensors x (1 + fragmentation) + reserve <= memory."""
        return tensor_bytes * (1.0 + self.fragmentation) + self.reserve_bytes <= self.memory

    @property
    def usable_tensor_bytes(self) -> float:
        """The most live tensor bytes that fit (the inverse of :meth:`fits`)."""
        return max(0.0, (self.memory - self.reserve_bytes) / (1.0 + self.fragmentation))

    def supports(self, dtype: str) -> bool:
        """Whether the type can run ``dtype``: fp32 always; tf32 always (a type without TF32 math
        runs it as fp32, exactly as precise); fp16 and bf16 only where the catalog lists a rate
        (bf16 on a V100, T4, Turing card or P100 would be emulated, far slower than planned)."""
        return dtype in ("fp32", "tf32") or dtype in self.peak

    @property
    def emulated(self) -> bool:
        """True when this type is a base type slowed down on purpose (single-machine demos)."""
        return self.emulates is not None

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s at ``dtype`` (falling back to fp32 where the type lacks it)."""
        return self.peak[self.math_dtype(dtype)]

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


def _fragmentation(f: Fields) -> float:
    value = f.number("fragmentation", DEFAULT_FRAGMENTATION, minimum=0.0)
    if value >= 1.0:
        raise f.error(f"expected a fraction in [0, 1), got {value:g}", "fragmentation")
    return value


def _fraction(f: Fields, value: object, key: str) -> float:
    return f.check_number(value, key, positive=True, maximum=1.0)


def parse_overhead(f: Fields) -> tuple[float, float]:
    """``overhead: {micro_batch: 50us, overlap_slowdown: 1.15, source: ...}``: each optional. Left
    out: none (0 s, factor 1), the cost model as before these terms; docs/cost-model.md
    ("Overheads", "Overlap") gives the estimates an entry may state, ``hetplan calibrate`` fits both."""
    micro = f.time("micro_batch", 0.0)
    slowdown = f.number("overlap_slowdown", 1.0, positive=True)
    if slowdown < 1.0:
        raise f.error(f"expected a factor >= 1 (overlap cannot speed compute up), got {slowdown:g}", "overlap_slowdown")
    f.raw("source", None)  # a citation; kept in the file
    f.done()
    return micro, slowdown


def _parse_efficiency(f: Fields) -> AchievedEfficiency:
    """``efficiency: {gemm: {dtype: fraction}, attention: f, memory: f, launch: 5us, sms: n}``."""
    gemm: dict[str, float] = {}
    for dtype, value in f.mapping_items("gemm"):
        if dtype not in DTYPE_BYTES:
            raise f.error(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPES)}", f"gemm.{dtype}")
        gemm[dtype] = _fraction(f, value, f"gemm.{dtype}")
    if "fp32" not in gemm:
        raise f.error("expected an fp32 figure (every dtype the type lacks runs at the fp32 rate)", "gemm.fp32")
    eff = AchievedEfficiency(
        gemm=gemm,
        attention=_fraction(f, f.raw("attention"), "attention"),
        memory=_fraction(f, f.raw("memory"), "memory"),
        launch_s=f.time("launch"),
        sms=f.integer("sms", minimum=1),
    )
    f.raw("source", None)  # a citation; kept in the file
    f.done()
    return eff


#: Backends a catalog entry may name: NCCL (RCCL on ROCm builds of torch) and gloo.
BACKENDS: tuple[str, ...] = ("nccl", "gloo")
#: Vendors whose GPUs run torch's ``nccl`` backend (NVIDIA: NCCL; AMD: RCCL under the same name).
_NCCL_VENDORS = ("NVIDIA", "AMD")


def default_backends(vendor: str) -> tuple[str, ...]:
    """Backends of an entry that states none: NCCL and gloo for an NVIDIA or AMD GPU, gloo alone
    otherwise (a CPU, or an accelerator torch.distributed has no collective library for)."""
    return ("nccl", "gloo") if vendor in _NCCL_VENDORS else ("gloo",)


def _parse_backends(f: Fields, vendor: str) -> tuple[str, ...]:
    """``backends: [nccl, gloo]``: each a known backend, no repeats; absent: the vendor's default."""
    if not f.has("backends"):
        return default_backends(vendor)
    names = f.list("backends")
    for i, name in enumerate(names):
        if name not in BACKENDS:
            raise f.error(f"unknown backend {name!r}; expected one of {', '.join(BACKENDS)}", f"backends[{i}]")
    if len(set(names)) != len(names):
        raise f.error("expected each backend once", "backends")
    return tuple(names)


def parse_device_spec(name: str, f: Fields) -> DeviceType:
    """A full device description: ``memory``, ``memory_bandwidth``, ``tflops: {dtype: TFLOP/s}``."""
    device = DeviceType(
        name=name,
        memory=f.bytes("memory"),
        memory_bandwidth=f.bandwidth("memory_bandwidth"),
        peak=_parse_peak(f, "tflops"),
        vendor=f.str("vendor", ""),
        aliases=tuple(f.list("aliases", [], non_empty=False)),
        reserve=f.bytes("reserve", None, positive=False),
        fragmentation=_fragmentation(f),
        efficiency=_parse_efficiency(f.child("efficiency")) if f.has("efficiency") else None,
    )
    device = replace(device, backends=_parse_backends(f, device.vendor))
    if f.has("price"):
        device = replace(device, price=parse_price(f.child("price")))
    if f.has("overhead"):
        micro, slowdown = parse_overhead(f.child("overhead"))
        device = replace(device, micro_batch_s=micro, overlap_slowdown=slowdown)
    for dtype in device.efficiency.gemm if device.efficiency else ():
        if dtype != "fp32" and dtype not in device.peak:
            raise f.error(f"a gemm figure for {dtype}, which this type has no peak for", f"efficiency.gemm.{dtype}")
    if device.reserve is not None and device.reserve >= device.memory:
        raise f.error(f"expected a reserve below the memory ({device.memory:.0f} bytes)", "reserve")
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
    """``emulate: {base: cpu, slowdown: 2.0, memory?: 4GiB, changes?: [{step: 10, slowdown: 3.0}]}``:
    a base type run slower on purpose; ``changes`` make it a straggler from a step on (emulation)."""
    base_name = f.str("base")
    base = catalog.get(base_name, file=f.file, field=f.where("base"))
    slowdown = f.number("slowdown", positive=True)
    if slowdown < 1.0:
        raise f.error(
            f"expected a slowdown >= 1 (an emulated device cannot be faster than its base), got {slowdown:g}",
            "slowdown",
        )
    memory = f.bytes("memory", base.memory)
    reserve = f.bytes("reserve", base.reserve, positive=False)
    changes: list[tuple[int, float]] = []
    for i, c in enumerate(f.list("changes", [])):
        if not isinstance(c, Fields):
            raise f.error("expected each change to be a mapping {step, slowdown}", f"changes[{i}]")
        step = c.integer("step", minimum=0)
        factor = c.number("slowdown", positive=True)
        if factor < 1.0:
            raise c.error(f"expected a slowdown >= 1, got {factor:g}", "slowdown")
        if changes and step <= changes[-1][0]:
            raise c.error(f"expected steps in increasing order, got {step} after {changes[-1][0]}", "step")
        c.done()
        changes.append((step, factor * base.slowdown))
    f.done()
    return replace(
        base,
        name=name,
        memory=memory,
        reserve=reserve,
        peak={k: v / slowdown for k, v in base.peak.items()},
        memory_bandwidth=base.memory_bandwidth / slowdown,
        aliases=(),
        # an emulated type of an emulated type is the root type slowed by both factors
        emulates=base.emulates or base.name,
        slowdown=slowdown * base.slowdown,
        slowdown_changes=tuple(changes),
        price=None,  # an emulated type is a demo on this machine, not hardware one rents
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

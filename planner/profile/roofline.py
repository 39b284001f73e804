"""Time estimates for a block: each kind of work on its own roof, at the rates a device type reaches.

Used by the analytic profiler (FLOPs and bytes from formulas, times from here) and to carry a time
measured on one device type to another (:func:`scale_block_time`)::

    from hetplan.contracts import load_catalog
    from hetplan.profile.analytic import FAMILIES
    from hetplan.profile.roofline import block_seconds
    v100 = load_catalog().get("V100-16GB")
    attn = FAMILIES["gpt"].blocks({"seq": 1024}, "fp16")[1]
    fwd, bwd = block_seconds(attn, v100, "fp16", 8)        # one micro-batch of 8

The model of one block call at micro-batch ``m`` (docs/estimates.md): the block's kernels run one
after another, so its time is the **sum** over its parts (:class:`~hetplan.profile.analytic.base.Work`)
of each part's own roofline:

    gemm       max(m·F / (peak(dtype)·gemm_fraction·sat(m·tiles)), bytes(m) / (bandwidth·memory)) + k·launch
    attention  the same at peak·gemm_fraction·attention (the batched per-head matmuls)
    memory     bytes(m) / (bandwidth·memory) + k·launch
    sat(t) = w / (w + 1/2), w = t / SMs             (wave quantization, smoothed)

with the fractions of :mod:`hetplan.profile.efficiency` (per device type, cited in the catalog).
Backward does :data:`BACKWARD_FLOPS_FACTOR` x the FLOPs, twice the activation bytes and kernels.

The older single-roof model (one ``max(compute, memory)`` per block at the raw peak times one
efficiency for every device, :class:`Efficiency`) is kept below, unchanged: it reproduces profiles
made before achieved efficiencies existed and is the "before" column of docs/estimates.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from hetplan.contracts.catalog import DTYPE_BYTES, DeviceType
from hetplan.errors import HetplanError
from hetplan.profile.efficiency import Achieved, achieved

if TYPE_CHECKING:  # the analytic package imports this module; only the types are needed here
    from hetplan.profile.analytic.base import BlockCost, Work

__all__ = [
    "BACKWARD_FLOPS_FACTOR",
    "Efficiency",
    "block_seconds",
    "compute_efficiency",
    "estimate_fwd_bwd",
    "estimate_seconds",
    "scale_block_time",
    "scale_time",
    "work_seconds",
    "works_seconds",
]

#: Backward costs twice the forward FLOPs: one GEMM for the input gradient and one for the weight
#: gradient, each the size of the forward GEMM (Kaplan et al. 2020; Narayanan et al. 2021).
BACKWARD_FLOPS_FACTOR = 2.0


def _checked_scaling(measured_s: float, dtype: str, to_dtype: str | None) -> str:
    """The dtype a carried time is for (``to_dtype``, default ``dtype``), after checking the inputs
    every carry shares: a non-negative measurement and known dtypes."""
    if measured_s < 0:
        raise HetplanError(f"expected a non-negative measured time, got {measured_s!r}", field="measured_s")
    target_dtype = to_dtype or dtype
    for name, value in (("dtype", dtype), ("to_dtype", target_dtype)):
        if value not in DTYPE_BYTES:
            raise HetplanError(f"unknown dtype {value!r}; expected one of {', '.join(DTYPE_BYTES)}", field=name)
    return target_dtype


def work_seconds(work: Work, m: float, rates: Achieved, *, backward: bool = False) -> float:
    """Seconds of one part of a block call at micro-batch ``m`` (forward, or ``backward``)."""
    if m < 0:
        raise HetplanError(f"expected a micro-batch >= 0, got {m!r}", field="micro_batch")
    factor = BACKWARD_FLOPS_FACTOR if backward else 1.0
    weights = work.bwd_weights if backward else work.weight_traffic
    memory = (weights + factor * m * work.traffic) / rates.bandwidth
    kernels = (2 if backward else 1) * work.kernels * rates.launch_s
    if work.kind == "memory" or work.flops <= 0 or m == 0:
        return memory + kernels
    rate = rates.gemm_flops if work.kind == "gemm" else rates.attention_flops
    saturation = 1.0 if work.tiles is None else rates.gemm_saturation(m * work.tiles)
    compute = factor * m * work.flops / (rate * saturation)
    return max(compute, memory) + kernels


def works_seconds(works: Sequence[Work], m: float, rates: Achieved) -> tuple[float, float]:
    """(forward, backward) seconds of a block made of ``works``: the parts run one after another."""
    fwd = sum(work_seconds(w, m, rates) for w in works)
    bwd = sum(work_seconds(w, m, rates, backward=True) for w in works)
    return fwd, bwd


def block_seconds(cost: BlockCost, device: DeviceType, dtype: str, m: float) -> tuple[float, float]:
    """(forward, backward) seconds of one call of ``cost`` on ``device`` at micro-batch ``m``."""
    return works_seconds(cost.works(), m, achieved(device, dtype))


def scale_block_time(
    measured_s: float,
    works: Sequence[Work],
    m: float,
    from_device: DeviceType,
    to_device: DeviceType,
    dtype: str,
    *,
    to_dtype: str | None = None,
    backward: bool = False,
) -> float:
    """Carry a time measured on ``from_device`` to ``to_device`` by the ratio of the two estimates.

    Both estimates use the achieved-efficiency model, so the ratio follows each device's *mix*: a
    block that is mostly GEMM carries by the ratio of achieved GEMM rates, a LayerNorm by the ratio
    of achieved bandwidths. The measurement keeps what the model cannot know (the real kernels,
    fusion, the framework). ``works`` are counted at ``dtype``; ``to_dtype`` (default ``dtype``)
    lets an fp32 measurement stand for an fp16 run, its bytes scaled by the element sizes.
    Identity when both devices and dtypes are the same.
    """
    target_dtype = _checked_scaling(measured_s, dtype, to_dtype)
    scale = DTYPE_BYTES[target_dtype] / DTYPE_BYTES[dtype]
    target_works = list(works)
    if scale != 1.0:
        target_works = [
            replace(
                w,
                traffic=w.traffic * scale,
                weight_traffic=w.weight_traffic * scale,
                bwd_weight_traffic=None if w.bwd_weight_traffic is None else w.bwd_weight_traffic * scale,
            )
            for w in works
        ]
    src, dst = achieved(from_device, dtype), achieved(to_device, target_dtype)
    source = sum(work_seconds(w, m, src, backward=backward) for w in works)
    target = sum(work_seconds(w, m, dst, backward=backward) for w in target_works)
    if source <= 0:
        return measured_s  # nothing to scale by: the measurement stands as is
    return measured_s * target / source


# -- the single-roof model of earlier profiles -------------------------------------------------


@dataclass(frozen=True)
class Efficiency:
    """The single-roof model's constants (profiles made before achieved efficiencies existed).

    One fraction of peak for every device type and every kind of work: it made every GPU look
    several times faster than measured and made device ratios follow paper peaks (docs/estimates.md
    has the comparison). Passing one to :func:`~hetplan.profile.analytic.analytic_profile`
    reproduces such a profile; new estimates use :func:`block_seconds`.

    compute_max: best fraction of dense peak FLOP/s a matmul-heavy block sustains once saturated.
        Large cuBLAS/cuDNN GEMMs reach 70-80 % of tensor-core peak, but a whole block also runs
        LayerNorm, softmax, bias and residual kernels in between; Megatron-LM reports 52 % of peak for
        whole GPT models on A100 (Narayanan et al. 2021), single blocks do a little better. 0.65.
    work_half: rows of parallel work (GEMM rows = micro-batch x tokens, or micro-batch x output
        pixels for a convolution, or micro-batch for a plain linear layer) at which a block reaches
        half of ``compute_max``. An A100 has 108 SMs and cuBLAS tiles are 64-256 rows high, so a
        GEMM needs a few hundred rows before every SM holds a full tile; 256 puts the half point
        there (and a single 1024-token GPT sample at 80 % of ``compute_max``).
    memory: fraction of the data-sheet memory bandwidth that streaming kernels reach. STREAM-like
        copies on HBM reach 85-92 %; unfused PyTorch elementwise kernels somewhat less. 0.8.
    launch_s: seconds added per kernel of a block call. PyTorch eager dispatch plus a CUDA launch
        costs about 4-10 us per op on the host; on a busy stream it partly overlaps with the GPU, so
        5 us is a middle value. It only matters for small blocks at small micro-batches, which is
        exactly where a pure roofline is too optimistic.
    """

    compute_max: float = 0.65
    work_half: float = 256.0
    memory: float = 0.8
    launch_s: float = 5e-6

    def __post_init__(self) -> None:
        if not 0.0 < self.compute_max <= 1.0:
            raise HetplanError(
                f"expected 0 < compute_max <= 1, got {self.compute_max!r}", field="efficiency.compute_max"
            )
        if not self.work_half >= 0.0:
            raise HetplanError(f"expected work_half >= 0, got {self.work_half!r}", field="efficiency.work_half")
        if not 0.0 < self.memory <= 1.0:
            raise HetplanError(f"expected 0 < memory <= 1, got {self.memory!r}", field="efficiency.memory")
        if not self.launch_s >= 0.0:
            raise HetplanError(f"expected launch_s >= 0, got {self.launch_s!r}", field="efficiency.launch_s")

    def to_dict(self) -> dict[str, Any]:
        """The constants as written into a profile's ``source``, plus the backward factor."""
        out: dict[str, Any] = asdict(self)
        out["backward_flops_factor"] = BACKWARD_FLOPS_FACTOR
        return out


_DEFAULT = Efficiency()


def compute_efficiency(work_items: float, efficiency: Efficiency | None = None) -> float:
    """Fraction of peak FLOP/s reached with ``work_items`` rows of parallel work.

    ``eff(w) = compute_max * w / (w + work_half)``: zero with no work, half of ``compute_max`` at
    ``work_half`` rows, approaching ``compute_max`` for large GEMMs. It is increasing, so per-sample
    time never grows with the micro-batch, and bounded by ``compute_max``.
    """
    e = efficiency or _DEFAULT
    if work_items < 0:
        raise HetplanError(f"expected work_items >= 0, got {work_items!r}", field="work_items")
    if work_items == 0:
        return 0.0
    return e.compute_max * work_items / (work_items + e.work_half)


def estimate_seconds(
    flops: float,
    bytes_moved: float,
    device: DeviceType,
    dtype: str,
    *,
    work_items: float,
    kernels: int = 1,
    efficiency: Efficiency | None = None,
) -> float:
    """Seconds for one block call: the slower of the compute and memory roofs, plus launch overhead.

    ``flops``, ``bytes_moved`` and ``work_items`` are totals for the call (the whole micro-batch).
    ``kernels`` is how many kernels the block launches; each adds ``efficiency.launch_s``.
    """
    e = efficiency or _DEFAULT
    if flops < 0 or bytes_moved < 0:
        raise HetplanError(f"expected non-negative flops and bytes, got {flops!r} and {bytes_moved!r}")
    if kernels < 0:
        raise HetplanError(f"expected kernels >= 0, got {kernels!r}", field="kernels")
    compute = 0.0
    if flops > 0:
        eff = compute_efficiency(work_items, e)
        if eff <= 0:
            raise HetplanError(
                f"a call with {flops:g} FLOPs needs work_items > 0, got {work_items!r}", field="work_items"
            )
        compute = flops / (device.peak_flops(dtype) * eff)
    memory = bytes_moved / (device.memory_bandwidth * e.memory) if bytes_moved > 0 else 0.0
    return max(compute, memory) + kernels * e.launch_s


def estimate_fwd_bwd(
    flops: float,
    fwd_bytes: float,
    bwd_bytes: float,
    device: DeviceType,
    dtype: str,
    *,
    work_items: float,
    kernels: int = 1,
    efficiency: Efficiency | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds: backward does :data:`BACKWARD_FLOPS_FACTOR` x the FLOPs,
    moves ``bwd_bytes`` and launches twice the kernels (one per gradient, per forward kernel)."""
    fwd = estimate_seconds(
        flops, fwd_bytes, device, dtype, work_items=work_items, kernels=kernels, efficiency=efficiency
    )
    bwd = estimate_seconds(
        BACKWARD_FLOPS_FACTOR * flops,
        bwd_bytes,
        device,
        dtype,
        work_items=work_items,
        kernels=2 * kernels,
        efficiency=efficiency,
    )
    return fwd, bwd


def scale_time(
    measured_s: float,
    flops: float,
    bytes_moved: float,
    from_device: DeviceType,
    to_device: DeviceType,
    dtype: str,
    work_items: float,
    *,
    to_dtype: str | None = None,
    kernels: int = 1,
    efficiency: Efficiency | None = None,
) -> float:
    """Carry a time by the ratio of two single-roof estimates (the earlier model; new code uses
    :func:`scale_block_time`, which follows each device's achieved rates per kind of work).

    The measurement keeps what the roofline cannot know (the real kernels, fusion, the framework);
    the ratio carries only what differs between the devices: peaks, bandwidth, launch overhead.
    ``bytes_moved`` is counted at ``dtype``; ``to_dtype`` (default ``dtype``) lets a CPU fp32
    measurement stand for a GPU fp16 run, the bytes scaled by the ratio of element sizes.
    Identity when both devices and dtypes are the same.
    """
    target_dtype = _checked_scaling(measured_s, dtype, to_dtype)
    target_bytes = bytes_moved * DTYPE_BYTES[target_dtype] / DTYPE_BYTES[dtype]
    kw: dict[str, Any] = {"work_items": work_items, "kernels": kernels, "efficiency": efficiency}
    source = estimate_seconds(flops, bytes_moved, from_device, dtype, **kw)
    target = estimate_seconds(flops, target_bytes, to_device, target_dtype, **kw)
    if source <= 0:
        # Nothing to scale by (no work, no launch overhead): the measurement stands as is.
        return measured_s
    return measured_s * target / source

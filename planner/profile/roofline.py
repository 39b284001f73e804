"""Roofline time estimates with stated efficiencies.

Used by the analytic profiler (FLOPs and bytes from formulas, times from here) and, later, to carry
a time measured on one device type to another (:func:`scale_time`)::

    from planner.contracts import load_catalog
    a100 = load_catalog().get("A100-80GB")
    t = estimate_seconds(2e12, 1e9, a100, "fp16", work_items=4096, kernels=6)   # one forward call

The model of one block call (all quantities for the whole micro-batch):

    time = max(flops / (peak(dtype) * compute_efficiency(work_items)),
               bytes_moved / (memory_bandwidth * memory_efficiency))
           + kernels * launch_s

Small micro-batches run below peak because a GEMM (or implicit-GEMM convolution) with few rows cannot
fill every SM with full tiles; :func:`compute_efficiency` models that as a saturating curve in the
number of independent rows of work. All constants live in :class:`Efficiency`, with their reasons.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from planner.contracts.catalog import DTYPE_BYTES, DeviceType
from planner.errors import HetplanError

__all__ = [
    "BACKWARD_FLOPS_FACTOR",
    "Efficiency",
    "compute_efficiency",
    "estimate_fwd_bwd",
    "estimate_seconds",
    "scale_time",
]

#: Backward costs twice the forward FLOPs: one GEMM for the input gradient and one for the weight
#: gradient, each the size of the forward GEMM (Kaplan et al. 2020; Narayanan et al. 2021).
BACKWARD_FLOPS_FACTOR = 2.0


@dataclass(frozen=True)
class Efficiency:
    """The fractions of the data-sheet peaks a real block reaches; every constant with its reason.

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
    """Carry a time measured on ``from_device`` to ``to_device`` by the ratio of roofline estimates.

    The measurement keeps what the roofline cannot know (the real kernels, fusion, the framework);
    the ratio carries only what differs between the devices: peaks, bandwidth, launch overhead.
    ``bytes_moved`` is counted at ``dtype``; ``to_dtype`` (default ``dtype``) lets a CPU fp32
    measurement stand for a GPU fp16 run, the bytes scaled by the ratio of element sizes.
    Identity when both devices and dtypes are the same.
    """
    if measured_s < 0:
        raise HetplanError(f"expected a non-negative measured time, got {measured_s!r}", field="measured_s")
    target_dtype = to_dtype or dtype
    for name, value in (("dtype", dtype), ("to_dtype", target_dtype)):
        if value not in DTYPE_BYTES:
            raise HetplanError(f"unknown dtype {value!r}; expected one of {', '.join(DTYPE_BYTES)}", field=name)
    target_bytes = bytes_moved * DTYPE_BYTES[target_dtype] / DTYPE_BYTES[dtype]
    kw: dict[str, Any] = {"work_items": work_items, "kernels": kernels, "efficiency": efficiency}
    source = estimate_seconds(flops, bytes_moved, from_device, dtype, **kw)
    target = estimate_seconds(flops, target_bytes, to_device, target_dtype, **kw)
    if source <= 0:
        # Nothing to scale by (no work, no launch overhead): the measurement stands as is.
        return measured_s
    return measured_s * target / source

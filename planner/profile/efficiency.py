"""Achieved efficiency: how much of a device's data-sheet peaks real kernels reach, per kind of work.

    from hetplan.contracts import load_catalog
    from hetplan.profile.efficiency import achieved
    v100 = load_catalog().get("V100-16GB")
    a = achieved(v100, "fp16")
    a.gemm_flops        # FLOP/s a large GEMM sustains: 0.55 x 125e12
    a.gemm_saturation(tiles=40)   # 0.5: half a wave of 128x128 tiles on 80 SMs

Why: a roofline at raw peak made every GPU look several times faster than it measures, and made
the *ratio* between two types follow their paper peaks, which is wrong exactly where a
heterogeneous planner needs it right (a consumer card or a power-capped one reaches a far smaller
fraction of its tensor peak than an A100). So each catalog type states, with a cited source, the
fraction it reaches for each kind of work (:class:`~hetplan.contracts.catalog.AchievedEfficiency`),
and every estimate times each kind of work on its own roof:

- ``gemm``: dense matmuls and convolutions (implicit GEMM), at the dtype's peak times the type's
  GEMM figure for that dtype, times a wave-quantization factor for GEMMs too small to fill the GPU;
- ``attention``: the batched per-head score and context matmuls, at the GEMM rate times the type's
  attention factor (head-dim-sized matmuls use the tensor cores poorly);
- ``memory``: elementwise, norm, softmax and lookup kernels, at bandwidth times the memory figure;
- plus a fixed cost per kernel launched.

Types without figures (an inline ``spec:`` in a cluster file) get :data:`GENERIC`, conservative
figures between those of the bundled data-centre and consumer parts. The figures and their
sources are tabulated in docs/estimates.md, with the check of the result against published
measurements.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetplan.contracts.catalog import AchievedEfficiency, DeviceType
from hetplan.errors import HetplanError

__all__ = ["GENERIC", "TILE", "WAVE_HALF", "Achieved", "achieved", "figures", "wave_saturation"]

#: Output tile of one thread block of a cuBLAS-class GEMM, rows x columns: 128 x 128 is the common
#: choice at training shapes (NVIDIA, "Matrix Multiplication Background User's Guide", tile
#: quantization); smaller GEMMs get smaller tiles, which the saturation curve's floor stands for.
TILE = 128 * 128

#: Waves of tiles at which a GEMM reaches half its saturated rate. A GEMM whose tiles fill the SMs
#: ``w`` times runs at ``w / ceil(w)`` of its rate (NVIDIA's guide, "wave quantization"); averaged
#: over each interval [n, n + 1) that is close to ``w / (w + 0.5)`` (0.75 at 1.5 waves, 0.83 at
#: 2.5, 0.875 at 3.5), and below one wave ``w / (w + 0.5)`` keeps a small GEMM from looking free.
#: In time terms every GEMM call pays half a wave of full tiles on top of its ideal time.
WAVE_HALF = 0.5

#: For a type that states no figures: conservative values between the bundled data-centre parts
#: (A100: GEMM 0.70 of tensor peak) and the power-capped ones (T4: 0.40); fp32 SIMT GEMMs reach a
#: larger fraction of their (lower) peak on every bundled type (0.6-0.85). Engineering estimates.
GENERIC = AchievedEfficiency(
    gemm={"fp32": 0.70, "tf32": 0.55, "fp16": 0.55, "bf16": 0.55},
    attention=0.5,
    memory=0.75,
    launch_s=5e-6,
    sms=80,
)


def wave_saturation(tiles: float, sms: int) -> float:
    """Fraction of its saturated rate a GEMM with ``tiles`` output tiles reaches on ``sms`` SMs.

    Increasing in ``tiles``, zero with no tiles, 1/2 at half a wave, approaching 1.
    """
    if tiles < 0:
        raise HetplanError(f"expected tiles >= 0, got {tiles!r}", field="tiles")
    if sms < 1:
        raise HetplanError(f"expected sms >= 1, got {sms!r}", field="sms")
    waves = tiles / sms
    return waves / (waves + WAVE_HALF)


def figures(device: DeviceType) -> AchievedEfficiency:
    """The type's stated figures, or :data:`GENERIC` for a type that states none."""
    return device.efficiency if device.efficiency is not None else GENERIC


@dataclass(frozen=True)
class Achieved:
    """The rates one device type reaches at one dtype, in base units (FLOP/s, bytes/s, seconds)."""

    device: str
    dtype: str  # the dtype whose peak the math runs at (after the catalog's fallback)
    gemm_flops: float
    attention_flops: float
    bandwidth: float
    launch_s: float
    sms: int

    def gemm_saturation(self, tiles: float) -> float:
        """:func:`wave_saturation` on this type's SMs."""
        return wave_saturation(tiles, self.sms)

    def to_dict(self) -> dict[str, Any]:
        """Rates in the units people quote (TFLOP/s, GB/s, microseconds), for docs and profiles."""
        return {
            "math_dtype": self.dtype,
            "gemm_tflops": round(self.gemm_flops / 1e12, 3),
            "attention_tflops": round(self.attention_flops / 1e12, 3),
            "bandwidth_gbs": round(self.bandwidth / 1e9, 1),
            "launch_us": round(self.launch_s * 1e6, 2),
            "sms": self.sms,
        }


def achieved(device: DeviceType, dtype: str) -> Achieved:
    """What ``device`` reaches at ``dtype``: its peaks times its stated (or generic) fractions.

    A dtype the type lacks runs at the fp32 peak (the catalog's fallback) with the fp32 figure.
    """
    eff = figures(device)
    math = device.math_dtype(dtype)
    fraction = eff.gemm_fraction(math)
    if fraction is None:
        fraction = GENERIC.gemm_fraction(math)
    assert fraction is not None  # GENERIC states every dtype
    gemm = device.peak[math] * fraction
    return Achieved(
        device=device.name,
        dtype=math,
        gemm_flops=gemm,
        attention_flops=gemm * eff.attention,
        bandwidth=device.memory_bandwidth * eff.memory,
        launch_s=eff.launch_s,
        sms=eff.sms,
    )

"""How far a predicted time can be trusted: a relative band from where the profile's times came from.

    from hetplan.profile.trust import time_band
    band = time_band(profile, [catalog.get("A100-80GB"), catalog.get("V100-16GB")])
    band.label()              # 'estimated times: x0.79 to x1.39, docs/estimates.md'
    band.interval(1.23)       # (0.97, 1.71): where the real time is expected to fall

A prediction is as good as the per-block times under it, and how good those are depends on their
``source`` (docs/estimates.md, "How far to trust an estimate"):

- ``measured``: the spread of the repeated measurements (the largest recorded ``spread`` s among
  the times used), as a ratio both ways: x1/(1+s) to x(1+s) (a spread of 159% is x0.39 to x2.59: a
  time cannot be more than 100% lower); :data:`MEASURED_DEFAULT` when a profile records none;
- ``imported``: another team's measurement on its own cluster and software, taken as far off as
  two clusters' measurements of the same GPU chip were in the validation data (:data:`IMPORTED`);
- ``calibrated``: the calibration's own errors on the measured runs (``loo_error`` where it has
  one, else ``residual``, from the profile's ``source.calibrated.runs``); without any, as estimated;
- ``estimated``: what the validation against published per-layer measurements found
  (:data:`ESTIMATED`: 80% of points fell inside), for the device types and the math (fp32/tf32) it
  covered; other types or fp16/bf16 math get the full range it saw (:data:`ESTIMATED_UNVALIDATED`);
  times *carried* from a measured type get the ratio band (:data:`CARRIED`), since only the ratio
  between the two types was estimated; carried from a CPU measurement to a GPU they get
  :data:`CPU_CARRIED`, an order of magnitude either way (docs/profiling.md: "CPU-to-GPU estimates
  are an order of magnitude at best"), since the GPU-to-GPU validation says nothing about them.

Labels are ratios (``x0.79 to x1.39``): the real time over the predicted one.

Several sources in one plan: the band is the envelope of theirs. The numbers below are printed by
``benchmarks/bench_estimates.py`` (docs/estimates.md); ``tests/profile/test_trust.py`` re-derives
them from the data when ``../shared`` is present.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hetplan.contracts.catalog import DeviceType
from hetplan.contracts.model_profile import ModelProfile

__all__ = [
    "CARRIED",
    "CPU_CARRIED",
    "ESTIMATED",
    "ESTIMATED_UNVALIDATED",
    "IMPORTED",
    "MEASURED_DEFAULT",
    "VALIDATED_DTYPES",
    "VALIDATED_TYPES",
    "Band",
    "time_band",
]

#: measured / estimated - 1 of the analytic per-layer times, 10th and 90th percentiles over the 49
#: validation points (docs/estimates.md: bench_estimates.py, regime tf32, "after").
ESTIMATED = (-0.21, 0.39)
#: The smallest and largest measured / estimated - 1 of any validation point.
ESTIMATED_UNVALIDATED = (-0.33, 0.54)
#: measured ratio / estimated ratio - 1 between two device types, 10th and 90th percentiles over
#: the 98 validation pairs: how far a time carried by the ratio of estimates can be off.
CARRIED = (-0.23, 0.56)
#: Times measured on a CPU and carried to a GPU: x0.1 to x10 (docs/profiling.md, "an order of
#: magnitude at best"; no validation data covers CPU-to-GPU ratios).
CPU_CARRIED = (-0.9, 9.0)
#: A100-40GB against A100-80GB (the same SXM4 GPU chip, measured on two clusters), largest gap.
IMPORTED = (-0.19, 0.19)
#: A measured time whose profile records no spread: the run-to-run variation of GPU kernel times
#: under a busy host (engineering estimate).
MEASURED_DEFAULT = 0.05
#: Device types and math the validation had measurements for (docs/estimates.md).
VALIDATED_TYPES = frozenset({"V100-16GB", "A100-40GB", "A100-80GB", "GH200", "TITAN-RTX", "RTX-2080", "RTX-3090"})
VALIDATED_DTYPES = frozenset({"fp32", "tf32"})
REFERENCE = "docs/estimates.md"


@dataclass(frozen=True)
class Band:
    """The real time is expected within [t x (1 + low), t x (1 + high)] of a prediction t
    (``low`` is above -1: a time is never 100% or more below another)."""

    low: float
    high: float
    sources: tuple[str, ...]
    reference: str = REFERENCE

    def interval(self, seconds: float) -> tuple[float, float]:
        """Where the real time of a predicted ``seconds`` is expected to fall."""
        return seconds * (1.0 + self.low), seconds * (1.0 + self.high)

    def label(self) -> str:
        """``estimated times: x0.79 to x1.39, docs/estimates.md`` (sources joined with '+'): the
        real time over the predicted one, as ratios (a percentage below -100% would be no time)."""
        what = "+".join(self.sources) or "no"
        return f"{what} times: {_ratio(1.0 + self.low)} to {_ratio(1.0 + self.high)}, {self.reference}"

    def to_dict(self) -> dict[str, Any]:
        """The ``band`` key of ``--json`` output."""
        return {
            "low": round(self.low, 4),
            "high": round(self.high, 4),
            "sources": list(self.sources),
            "reference": self.reference,
        }


def _ratio(factor: float) -> str:
    """``x0.79``; two significant digits below 0.1 (``x0.039``), none above 10 (``x12``)."""
    factor = round(factor, 6)  # 1 + (-0.9) is 0.09999...
    if factor >= 10:
        return f"x{factor:.0f}"
    return f"x{factor:.2g}" if factor < 0.1 else f"x{factor:.2f}"


def _spread_band(spread: float) -> tuple[float, float]:
    """A measured spread ``s`` as a ratio both ways: x1/(1+s) to x(1+s)."""
    return 1.0 / (1.0 + spread) - 1.0, spread


def _from_cpu(profile: ModelProfile) -> bool:
    """The profile's times were measured on a CPU (and any carried times were carried from it)."""
    note = profile.source.get("carried")
    origin = note.get("from") if isinstance(note, Mapping) else None
    return profile.source.get("backend") == "cpu" or origin == "cpu"


def _calibrated(profile: ModelProfile) -> tuple[float, float] | None:
    """The calibration's deviations of the real iteration time from its fitted prediction."""
    note = profile.source.get("calibrated")
    runs = note.get("runs") if isinstance(note, Mapping) else None
    errors = []
    for run in runs if isinstance(runs, list) else []:
        if not isinstance(run, Mapping):
            continue
        error = run.get("loo_error") if isinstance(run.get("loo_error"), (int, float)) else run.get("residual")
        if isinstance(error, (int, float)) and error > -1.0:
            errors.append(1.0 / (1.0 + error) - 1.0)  # predicted/measured - 1 -> measured/predicted - 1
    if not errors:
        return None
    return min(min(errors), 0.0), max(max(errors), 0.0)


def _carried_targets(profile: ModelProfile) -> set[str]:
    note = profile.source.get("carried")
    targets = note.get("to") if isinstance(note, Mapping) else None
    return {t for t in targets if isinstance(t, str)} if isinstance(targets, list) else set()


def _estimated(profile: ModelProfile, key: str) -> tuple[float, float]:
    if key in _carried_targets(profile):
        return CPU_CARRIED if _from_cpu(profile) else CARRIED
    if key in VALIDATED_TYPES and profile.dtype in VALIDATED_DTYPES:
        return ESTIMATED
    return ESTIMATED_UNVALIDATED


def time_band(profile: ModelProfile, devices: Iterable[DeviceType]) -> Band:
    """The band of a prediction that uses ``profile``'s times on ``devices`` (the types a plan uses)."""
    lows, highs, sources = [0.0], [0.0], []
    for key in dict.fromkeys(profile.time_scale(device)[0] for device in devices):
        timings = [t for block in profile.blocks for t in block.times.get(key, {}).values()]
        for source in dict.fromkeys(t.source for t in timings):
            if source == "measured":
                spreads = [t.spread for t in timings if t.source == "measured" and t.spread is not None]
                low, high = _spread_band(max(spreads) if spreads else MEASURED_DEFAULT)
            elif source == "imported":
                low, high = IMPORTED
            elif source == "calibrated":
                low, high = _calibrated(profile) or _estimated(profile, key)
            else:
                low, high = _estimated(profile, key)
            lows.append(low)
            highs.append(high)
            sources.append(source)
    return Band(low=min(lows), high=max(highs), sources=tuple(dict.fromkeys(sources)))

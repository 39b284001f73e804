"""Build a :class:`~hetplan.contracts.ModelProfile` from a family's formulas and the roofline.

    from hetplan.contracts import load_catalog
    from hetplan.profile.analytic import analytic_profile
    catalog = load_catalog()
    devices = [catalog.get("A100-80GB"), catalog.get("V100-16GB")]
    profile = analytic_profile("gpt", {"layers": 24, "hidden": 1024}, devices=devices, dtype="fp16")
    profile.save("gpt.profile.yaml")

Every time in the result is marked ``source: estimated``; ``source`` in the profile records the
efficiency figures used per device type, so an estimate can be reproduced or compared with a
measurement. Times come from :func:`hetplan.profile.roofline.block_seconds` (each kind of work on
its own roof, at the rates each type reaches: docs/estimates.md); passing ``efficiency=`` (the
single-roof :class:`~hetplan.profile.roofline.Efficiency`) reproduces a profile made before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hetplan.contracts.catalog import DeviceType
from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.errors import HetplanError
from hetplan.profile.analytic.base import BlockCost, dtype_bytes
from hetplan.profile.analytic.registry import get_family
from hetplan.profile.efficiency import achieved, figures
from hetplan.profile.roofline import Efficiency, estimate_fwd_bwd, works_seconds

__all__ = ["DEFAULT_MICRO_BATCHES", "analytic_profile", "block_times"]

#: Powers of two from 1: include 1 because below its smallest size a profile is read linearly,
#: which would hide how slow a tiny micro-batch is.
DEFAULT_MICRO_BATCHES: tuple[int, ...] = (1, 2, 4, 8)


def _check_micro_batches(micro_batches: Sequence[int]) -> tuple[int, ...]:
    sizes = tuple(micro_batches)
    if not sizes:
        raise HetplanError("expected at least one micro-batch size", field="micro_batches")
    for m in sizes:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise HetplanError(f"expected positive integer micro-batch sizes, got {m!r}", field="micro_batches")
    return tuple(sorted(set(sizes)))


def block_times(
    cost: BlockCost,
    device: DeviceType,
    dtype: str,
    micro_batches: Sequence[int],
    efficiency: Efficiency | None = None,
) -> dict[int, Timing]:
    """Estimated (forward, backward) seconds of one block at each micro-batch size: by the
    achieved-efficiency model, or by the single-roof model when ``efficiency`` is given."""
    out: dict[int, Timing] = {}
    if efficiency is None:
        rates = achieved(device, dtype)
        works = cost.works()
        for m in micro_batches:
            fwd, bwd = works_seconds(works, m, rates)
            out[m] = Timing(fwd=fwd, bwd=bwd, source="estimated")
        return out
    for m in micro_batches:
        fwd, bwd = estimate_fwd_bwd(
            m * cost.flops_fwd,
            cost.bytes_moved(m),
            cost.bwd_bytes_moved(m),
            device,
            dtype,
            work_items=m * cost.work_items,
            kernels=cost.kernels,
            efficiency=efficiency,
        )
        out[m] = Timing(fwd=fwd, bwd=bwd, source="estimated")
    return out


def _efficiency_note(devices: Sequence[DeviceType], dtype: str, legacy: Efficiency | None) -> dict[str, Any]:
    """What the times were computed with, per device type (recorded in the profile's ``source``)."""
    if legacy is not None:
        return {"model": "single roof (legacy)", **legacy.to_dict()}
    return {
        "model": "achieved efficiency per device type and kind of work (docs/estimates.md)",
        "devices": {d.name: {**figures(d).to_dict(), **achieved(d, dtype).to_dict()} for d in devices},
    }


def analytic_profile(
    family: str,
    config: Mapping[str, Any] | None = None,
    *,
    devices: Sequence[DeviceType],
    dtype: str = "fp32",
    micro_batches: tuple[int, ...] = DEFAULT_MICRO_BATCHES,
    efficiency: Efficiency | None = None,
) -> ModelProfile:
    """An estimated profile of ``family`` with ``config`` (defaults filled in) on each device type.

    Unknown families, unknown or invalid settings, an unknown dtype and bad micro-batch sizes raise
    :class:`~hetplan.errors.HetplanError` naming the field (``family``, ``config.heads``, ...).
    """
    fam = get_family(family)
    dtype_bytes(dtype)
    full = fam.full_config(config)
    sizes = _check_micro_batches(micro_batches)
    names = [device.name for device in devices]
    if len(set(names)) != len(names):
        raise HetplanError(f"device types named twice: {', '.join(names)}", field="devices")
    blocks = []
    for cost in fam.build(full, dtype):
        times = {device.name: block_times(cost, device, dtype, sizes, efficiency) for device in devices}
        blocks.append(
            Block(
                name=cost.name,
                kind=cost.kind,
                params=cost.params,
                param_bytes=cost.param_bytes,
                activation_bytes=cost.activation_bytes,
                output_bytes=cost.output_bytes,
                flops_fwd=cost.flops_fwd,
                times=times,
            )
        )
    source = {
        "tool": "hetplan analytic",
        "efficiency": _efficiency_note(devices, dtype, efficiency),
        "flops": "2 per multiply-add; matmuls and convolutions only",
        "devices": {d.name: d.label() for d in devices},
    }
    return ModelProfile(
        model={"family": fam.name, "config": full},
        dtype=dtype,
        blocks=blocks,
        input_bytes=fam.input_bytes(full, dtype),
        source=source,
    )

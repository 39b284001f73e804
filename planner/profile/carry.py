"""Carry a profile's times from the device type they were measured on to other catalog types.

    gpu_profile = carry_times(profile, "V100-16GB", [catalog.get("T4"), catalog.get("A100-80GB")])

Each block's time at each micro-batch size is scaled by the ratio of roofline estimates on the two
devices (:func:`planner.profile.roofline.scale_time`): the measurement keeps what the roofline cannot
know, the ratio carries what differs (peak FLOP/s at the dtype, memory bandwidth). The block is
taken as saturated (the measurement already holds the small-batch inefficiency of the source device,
and the ratio between two GPUs at the same shape varies little). Where a profile has no FLOPs for a
block (PipeDream graphs), it is taken as compute-bound and scaled by the ratio of peak FLOP/s.
Carried times are marked ``estimated``; times the profile already has are kept as they are.
"""

from __future__ import annotations

from dataclasses import replace

from planner.contracts.catalog import Catalog, DeviceType
from planner.contracts.model_profile import Block, ModelProfile, Timing
from planner.errors import HetplanError
from planner.profile.roofline import BACKWARD_FLOPS_FACTOR, scale_time

__all__ = ["carry_times"]

_SATURATED_WORK = 1e6  # rows of work: far past the efficiency curve's knee


def _scale(seconds: float, flops: float, nbytes: float, source: DeviceType, target: DeviceType, dtype: str) -> float:
    if flops <= 0:
        return seconds * source.peak_flops(dtype) / target.peak_flops(dtype)
    return scale_time(seconds, flops, nbytes, source, target, dtype, _SATURATED_WORK)


def carry_times(
    profile: ModelProfile, source_name: str, targets: list[DeviceType], *, catalog: Catalog | None = None
) -> ModelProfile:
    """A copy of ``profile`` with times for ``targets`` estimated from those of ``source_name``."""
    from planner.contracts.catalog import load_catalog

    catalog = catalog or load_catalog()
    if source_name not in profile.device_types():
        raise HetplanError(
            f"the profile has no times for {source_name!r} to carry (it has: {', '.join(profile.device_types())})",
            file=profile.file,
            field="blocks[].time",
        )
    source = catalog.get(source_name)
    blocks: list[Block] = []
    for block in profile.blocks:
        times = dict(block.times)
        for target in targets:
            if target.name in times:
                continue
            carried = {}
            for m, t in block.times[source_name].items():
                flops = block.flops_fwd * m
                nbytes = block.param_bytes + m * (block.activation_bytes + block.output_bytes)
                fwd = _scale(t.fwd, flops, nbytes, source, target, profile.dtype)
                bwd = _scale(t.bwd, BACKWARD_FLOPS_FACTOR * flops, 2 * nbytes, source, target, profile.dtype)
                carried[m] = Timing(fwd=fwd, bwd=bwd, source="estimated")
            times[target.name] = carried
        blocks.append(replace(block, times=times))
    source_note = dict(profile.source)
    source_note["carried"] = {"from": source_name, "to": [t.name for t in targets], "method": "roofline ratio"}
    return replace(profile, blocks=blocks, source=source_note)

"""Build a :class:`~hetplan.contracts.ModelProfile` from a family's formulas and the roofline.

    from hetplan.contracts import load_catalog
    from hetplan.profile.analytic import analytic_profile
    catalog = load_catalog()
    devices = [catalog.get("A100-80GB"), catalog.get("V100-16GB")]
    profile = analytic_profile("gpt", {"layers": 24, "hidden": 1024}, devices=devices, dtype="fp16")
    profile.save("gpt.profile.yaml")
    profile.tp_degrees(1)                     # (1, 2, 4, 8): layers split Megatron-style (gpt, bert)

Every time in the result is marked ``source: estimated``; ``source`` in the profile records the
efficiency figures used per device type, so an estimate can be reproduced or compared with a
measurement. Times come from :func:`hetplan.profile.roofline.block_seconds` (each kind of work on
its own roof, at the rates each type reaches: docs/estimates.md); passing ``efficiency=`` (the
single-roof :class:`~hetplan.profile.roofline.Efficiency`) reproduces a profile made before.

Tensor-parallel degrees (``tp_degrees``, default 1, 2, 4, 8): every degree that divides the heads
and the MLP width is estimated for the blocks the family splits (gpt and bert layers; not the
embedding or the head), each from one device's share of the work, timed by the same model (a
smaller GEMM fills fewer SMs, so a degree-t time is above 1/t of degree 1's). Each timing carries
``recompute``: the forward seconds of the attention core (the parts selective recomputation redoes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from hetplan.contracts.catalog import DeviceType
from hetplan.contracts.model_profile import Block, ModelProfile, SharedParams, TensorParallel, Timing
from hetplan.errors import HetplanError
from hetplan.profile.analytic.base import BlockCost, dtype_bytes
from hetplan.profile.analytic.registry import get_family
from hetplan.profile.efficiency import achieved, figures
from hetplan.profile.roofline import Efficiency, estimate_fwd_bwd, works_seconds

__all__ = ["DEFAULT_MICRO_BATCHES", "DEFAULT_TP_DEGREES", "analytic_profile", "block_times"]

#: Powers of two from 1: include 1 because below its smallest size a profile is read linearly,
#: which would hide how slow a tiny micro-batch is.
DEFAULT_MICRO_BATCHES: tuple[int, ...] = (1, 2, 4, 8)
#: Tensor-parallel degrees estimated where a family splits its blocks (one node's GPUs: up to 8).
DEFAULT_TP_DEGREES: tuple[int, ...] = (1, 2, 4, 8)


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
            recompute = works_seconds(cost.recompute_parts, m, rates)[0] if cost.recompute_parts else None
            out[m] = Timing(fwd=fwd, bwd=bwd, source="estimated", recompute=recompute)
        return out
    core_flops = sum(w.flops for w in cost.recompute_parts)
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
        # the single roof has no parts: the core's share of the FLOPs stands for its share of the time
        recompute = fwd * core_flops / cost.flops_fwd if cost.recompute_parts and cost.flops_fwd else None
        out[m] = Timing(fwd=fwd, bwd=bwd, source="estimated", recompute=recompute)
    return out


def _check_tp_degrees(tp_degrees: Sequence[int]) -> tuple[int, ...]:
    degrees = tuple(sorted(set(tp_degrees)))
    for t in degrees:
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise HetplanError(f"expected positive integer tensor-parallel degrees, got {t!r}", field="tp_degrees")
    return degrees


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
    tp_degrees: Sequence[int] = DEFAULT_TP_DEGREES,
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
    degrees = [t for t in _check_tp_degrees(tp_degrees) if t > 1]
    split = {t: fam.blocks_at(full, dtype, t) for t in degrees}
    blocks = []
    for i, cost in enumerate(fam.build(full, dtype)):
        times = {device.name: block_times(cost, device, dtype, sizes, efficiency) for device in devices}
        shards = {t: split[t][i] for t in degrees if split[t][i] is not None}
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
                selective_bytes=cost.selective_bytes,
                tensor_parallel={
                    t: TensorParallel(
                        params=c.params,
                        param_bytes=c.param_bytes,
                        activation_bytes=c.activation_bytes,
                        allreduce_bytes=c.allreduce_bytes,
                        selective_bytes=c.selective_bytes,
                        times={d.name: block_times(c, d, dtype, sizes, efficiency) for d in devices},
                    )
                    for t, c in shards.items()
                    if c is not None
                },
            )
        )
    source = {
        "tool": "hetplan analytic",
        "efficiency": _efficiency_note(devices, dtype, efficiency),
        "flops": "2 per multiply-add; matmuls and convolutions only",
        "devices": {d.name: d.label() for d in devices},
        "tensor_parallel": (
            "Megatron-style layers, no sequence parallelism; the GPT's embedding and head vocabulary-parallel, "
            "other families' replicated in the group"
        ),
    }
    shared = fam.shared(full, dtype, degrees)
    return ModelProfile(
        model={"family": fam.name, "config": full},
        dtype=dtype,
        blocks=_without_shared(blocks, shared),
        input_bytes=fam.input_bytes(full, dtype),
        source=source,
        shared=shared,
    )


def _without_shared(blocks: list[Block], shared: list[SharedParams]) -> list[Block]:
    """The blocks with each shared entry taken out of every holder's parameters (at each degree,
    the member's share), since the profile lists it once (``ModelProfile.shared``)."""
    out = list(blocks)
    for entry in shared:
        for b in entry.blocks:
            block = out[b]
            out[b] = replace(
                block,
                params=block.params - entry.params,
                param_bytes=block.param_bytes - entry.param_bytes,
                tensor_parallel={
                    t: replace(data, params=data.params - entry.at(t)[0], param_bytes=data.param_bytes - entry.at(t)[1])
                    for t, data in block.tensor_parallel.items()
                },
            )
    return out

"""Carry a profile's times from the device type they were measured on to other catalog types.

    gpu_profile = carry_times(profile, "V100-16GB", [catalog.get("T4"), catalog.get("A100-80GB")])

Each block's time at each micro-batch size is multiplied by the ratio of the two devices'
estimates (:func:`hetplan.profile.roofline.scale_block_time`), from the same achieved-efficiency
model the analytic profiler uses: each kind of work in the block (GEMMs, attention matmuls,
memory-bound kernels) scales by the ratio of the rates the two types actually reach for that kind,
so a block's carried speed depends on its mix, not on paper peaks. The measurement keeps what the
model cannot know (the real kernels, fusion, the framework).

Where the block's work comes from, best first (:func:`block_works`):

1. the model is an analytic family (``model: {family, config}``, as measured zoo models are): the
   family's own per-block parts, at the measured micro-batch size;
2. a ``transformer`` block (importers) whose FLOPs match a standard layer of the profile's stated
   hidden size, sequence and heads: the analytic attention + MLP parts;
3. otherwise one GEMM part with the block's FLOPs (its shape unknown: taken as filling the GPU,
   since the measurement already holds the source's small-batch behaviour) and one memory part
   moving the bytes the block keeps and outputs per sample (the tensors its elementwise kernels
   wrote); a block with no FLOPs is memory work if it is an embedding or a norm, and otherwise
   (PipeDream graphs state no FLOPs) scales by the ratio of achieved GEMM rates.

Carried times are marked ``estimated``; times the profile already has are kept as they are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hetplan.contracts.catalog import Catalog, DeviceType
from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.errors import HetplanError
from hetplan.profile.analytic.base import Work, memory_work
from hetplan.profile.analytic.registry import FAMILIES
from hetplan.profile.analytic.transformer import attention_block, mlp_block
from hetplan.profile.roofline import scale_block_time

__all__ = ["block_works", "carry_times"]

#: Block kinds that do no matmul work when a profile states no FLOPs for them.
_MEMORY_KINDS = ("embedding", "final_norm", "norm", "layernorm")
#: Config key spellings for a transformer layer's shape (hetplan families; Sailor/Megatron configs).
_SHAPE_KEYS = {
    "hidden": ("hidden", "hidden_size"),
    "seq": ("seq", "sequence_length"),
    "heads": ("heads", "num_attention_heads"),
}


def _family_works(profile: ModelProfile) -> list[tuple[Work, ...]] | None:
    """Per-block parts from the analytic family the profile names, if its blocks line up."""
    family = profile.model.get("family")
    if family not in FAMILIES:
        return None
    try:
        costs = FAMILIES[family].blocks(profile.model.get("config") or {}, profile.dtype)
    except HetplanError:
        return None
    if [c.name for c in costs] != [b.name for b in profile.blocks]:
        return None
    return [c.works() for c in costs]


def _shape(config: Mapping[str, Any]) -> dict[str, int] | None:
    out: dict[str, int] = {}
    for key, names in _SHAPE_KEYS.items():
        value = next((config[n] for n in names if isinstance(config.get(n), int) and config[n] > 0), None)
        if value is None:
            return None
        out[key] = value
    return out if out["hidden"] % out["heads"] == 0 else None


def _transformer_works(block: Block, config: Mapping[str, Any], dtype_bytes: int) -> tuple[Work, ...] | None:
    """A standard layer's attention + MLP parts, when the block's FLOPs say it is one."""
    shape = _shape(config)
    if shape is None or block.kind != "transformer":
        return None
    s, h, a = shape["seq"], shape["hidden"], shape["heads"]
    attn = attention_block("attn", seq=s, hidden=h, heads=a, dtype_bytes=dtype_bytes)
    mlp = mlp_block("mlp", seq=s, hidden=h, ffn=4 * h, dtype_bytes=dtype_bytes)
    if not math.isclose(attn.flops_fwd + mlp.flops_fwd, block.flops_fwd, rel_tol=0.01):
        return None
    return attn.works() + mlp.works()


def _generic_works(block: Block) -> tuple[Work, ...]:
    """One GEMM part of unknown shape plus the memory work the block's kept bytes stand for."""
    traffic = block.activation_bytes + block.output_bytes
    if block.flops_fwd > 0:
        return (Work(kind="gemm", flops=block.flops_fwd, tiles=None, kernels=0), memory_work(traffic, 0))
    if block.kind in _MEMORY_KINDS:
        return (memory_work(max(traffic, 1.0), 0),)
    # No FLOPs stated and not a lookup or norm: unknown compute, scaled by achieved GEMM rates.
    return (Work(kind="gemm", flops=1.0, tiles=None, kernels=0),)


def block_works(profile: ModelProfile) -> list[tuple[Work, ...]]:
    """The work of each block of ``profile`` by kind, as well as the profile lets us know it."""
    family = _family_works(profile)
    if family is not None:
        return family
    config = profile.model.get("config") or {}
    out: list[tuple[Work, ...]] = []
    for block in profile.blocks:
        works = _transformer_works(block, config, profile.dtype_bytes) if isinstance(config, Mapping) else None
        out.append(works if works is not None else _generic_works(block))
    return out


def carry_times(
    profile: ModelProfile, source_name: str, targets: list[DeviceType], *, catalog: Catalog | None = None
) -> ModelProfile:
    """A copy of ``profile`` with times for ``targets`` estimated from those of ``source_name``."""
    from hetplan.contracts.catalog import load_catalog

    catalog = catalog or load_catalog()
    if source_name not in profile.device_types():
        raise HetplanError(
            f"the profile has no times for {source_name!r} to carry (it has: {', '.join(profile.device_types())})",
            file=profile.file,
            field="blocks[].time",
        )
    source = catalog.get(source_name)
    works_by_block = block_works(profile)
    blocks: list[Block] = []

    def carry(by_size: dict[int, Timing], works: tuple[Work, ...], target: DeviceType) -> dict[int, Timing]:
        carried = {}
        for m, t in by_size.items():
            fwd = scale_block_time(t.fwd, works, m, source, target, profile.dtype)
            bwd = scale_block_time(t.bwd, works, m, source, target, profile.dtype, backward=True)
            # selective recomputation's share of the forward is kept (the same kernels, on the target)
            recompute = t.recompute * fwd / t.fwd if t.recompute is not None and t.fwd > 0 else t.recompute
            carried[m] = Timing(fwd=fwd, bwd=bwd, source="estimated", recompute=recompute)
        return carried

    for block, works in zip(profile.blocks, works_by_block, strict=True):
        times = dict(block.times)
        shards = dict(block.tensor_parallel)
        for target in targets:
            if target.name not in times:
                times[target.name] = carry(block.times[source_name], works, target)
            # a degree's times carried by the whole block's ratio of kinds of work (an approximation:
            # its GEMMs are smaller, docs/estimates.md)
            for t, shard in shards.items():
                if source_name in shard.times and target.name not in shard.times:
                    new_times = {**shard.times, target.name: carry(shard.times[source_name], works, target)}
                    shards[t] = replace(shards[t], times=new_times)
        blocks.append(replace(block, times=times, tensor_parallel=shards))
    source_note = dict(profile.source)
    source_note["carried"] = {
        "from": source_name,
        "to": [t.name for t in targets],
        "method": "ratio of achieved-efficiency estimates per kind of work (docs/estimates.md)",
    }
    return replace(profile, blocks=blocks, source=source_note)

"""Tensor parallelism for user and Hugging Face models, from a plan of ``"colwise"`` / ``"rowwise"``
linear layers (``transformers``' ``base_model_tp_plan``, or a factory's ``ModelSpec.tp_plan``).

    plan = zoo.tp_plan(index)             # {"self_attn.q_proj": "colwise", "self_attn.o_proj": "rowwise"}
    shard = shard_model_block(zoo, index, zoo.build_block(index, seed), group)
    shard.tp_specs                        # {"self_attn.q_proj.weight": ShardSpec(0), ...}

The plan means what ``torch.distributed.tensor.parallel``'s ``ColwiseParallel`` / ``RowwiseParallel``
mean: a column-parallel layer keeps rows ``[r·n/t, (r+1)·n/t)`` of its weight (and bias) and takes the
whole input; a row-parallel one keeps those columns of its weight, takes the previous layer's local
output and all-reduces its partial output before adding its bias (kept whole on every member). It is
executed as the zoo GPT's Megatron blocks are (:mod:`hetplan.models.gpt_tp`): plain local shards cut
from the full deterministic block with :class:`~hetplan.models.gpt_tp.ShardSpec`, and the conjugate
operators ``f`` / ``g`` on the group, rather than DTensor parameters, so that the runtime's gradient
groups, global norm, mixed precision and checkpoints (which all work on local shards and
``tp_specs``) apply unchanged. Heads: a layer such as ``LlamaAttention`` reshapes with ``-1`` heads,
so a member with ``1/t`` of q, k and v computes ``1/t`` of the heads, as ``transformers``' own TP does.

Only ``nn.Linear`` layers are cut; a plan naming anything else, or a model without a plan at degree
above 1, is refused with one line.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from hetplan.errors import HetplanError
from hetplan.models.base import ZooModel
from hetplan.models.gpt_tp import ShardSpec, TpGroup, copy_to_group, reduce_from_group, shard_block

__all__ = ["ColwiseLinear", "RowwiseLinear", "has_tp_form", "shard_model_block"]

STYLES = ("colwise", "rowwise")


class ColwiseLinear(nn.Module):
    """Rows ``[r·n/t, (r+1)·n/t)`` of a Linear: the whole input in, a slice of the output out."""

    def __init__(self, full: nn.Linear, group: TpGroup) -> None:
        super().__init__()
        self.group = group
        spec = ShardSpec(0)
        self.weight = nn.Parameter(spec.cut(full.weight.detach(), group.size, group.rank))
        self.bias = None if full.bias is None else nn.Parameter(spec.cut(full.bias.detach(), group.size, group.rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_group(x, self.group), self.weight, self.bias)


class RowwiseLinear(nn.Module):
    """Columns ``[r·n/t, (r+1)·n/t)`` of a Linear: a slice of the input in, the all-reduced output out."""

    def __init__(self, full: nn.Linear, group: TpGroup) -> None:
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(ShardSpec(1).cut(full.weight.detach(), group.size, group.rank))
        self.bias = None if full.bias is None else nn.Parameter(full.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_group(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


def has_tp_form(zoo: ZooModel) -> bool:
    """Whether the model may run at a degree above 1: a zoo family (the GPT is cut, the others are
    replicated, as before), or a user or Hugging Face model that declares a plan."""
    return "family" in zoo.model or any(zoo.tp_plan(i) is not None for i in range(zoo.n_blocks))


def shard_model_block(zoo: ZooModel, index: int, block: nn.Module, group: TpGroup) -> nn.Module:
    """Block ``index``'s member for ``group``: the zoo GPT's Megatron blocks, a declared plan's layers
    cut (the block changed in place, with ``tp_specs``), or the block itself (replicated).

    Raises:
        HetplanError: at ``tensor_parallel``, a model with no plan at degree > 1, or a plan naming a
            layer that is not an ``nn.Linear`` or does not split ``group.size`` ways.
    """
    if group.size == 1:
        return block
    plan = zoo.tp_plan(index)
    if plan is None:
        if not has_tp_form(zoo):
            raise HetplanError(
                f"{_what(zoo)} declares no tensor-parallel plan (a transformers base_model_tp_plan or a "
                "ModelSpec tp_plan); use tensor parallelism 1",
                field="tensor_parallel",
            )
        return shard_block(block, group)
    specs: dict[str, ShardSpec] = {}
    name = zoo.block_names()[index]
    for path, style in sorted(plan.items()):
        if style not in STYLES:
            raise HetplanError(
                f"block {name}: {path} is planned {style!r}; hetplan cuts 'colwise' and 'rowwise' layers",
                field="tensor_parallel",
            )
        full = block.get_submodule(path)
        if type(full) is not nn.Linear:
            raise HetplanError(
                f"block {name}: {path} is a {type(full).__name__}; tensor parallelism cuts nn.Linear layers",
                field="tensor_parallel",
            )
        part: nn.Module = ColwiseLinear(full, group) if style == "colwise" else RowwiseLinear(full, group)
        parent_path, _, attr = path.rpartition(".")
        setattr(block.get_submodule(parent_path) if parent_path else block, attr, part.train(full.training))
        specs[f"{path}.weight"] = ShardSpec(0 if style == "colwise" else 1)
        if full.bias is not None and style == "colwise":
            specs[f"{path}.bias"] = ShardSpec(0)
    block.tp_specs = specs  # type: ignore[assignment]
    block.group = group  # type: ignore[assignment]  # checkpoints gather a shard's parts over it
    return block


def _what(zoo: ZooModel) -> str:
    model: dict[str, Any] = zoo.model
    return str(model.get("factory") or model.get("hf") or model.get("family") or "the model")

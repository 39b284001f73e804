"""Tensor parallelism for user and Hugging Face models, from a plan of ``"colwise"`` / ``"rowwise"``
linear layers (``transformers``' ``base_model_tp_plan``, or a factory's ``ModelSpec.tp_plan``).

    plan = zoo.tp_plan(index)             # {"self_attn.q_proj": "colwise", "self_attn.o_proj": "rowwise"}
    shard = shard_model_block(zoo, index, zoo.build_block(index, seed), group)
    shard.tp_specs                        # {"self_attn.q_proj.weight": ShardSpec(0), ...}

In a run, the plan is applied by ``torch.distributed.tensor.parallel``: ``parallelize_module`` with
``ColwiseParallel`` / ``RowwiseParallel`` on the planned layers, over a ``DeviceMesh`` made from the
member's tensor-parallel process group. Their hooks turn a layer's input into a DTensor and its
output back (a row-parallel layer's partial outputs all-reduced, a column-parallel layer's input
gradient all-reduced), and the layer computes on DTensors. The parameters, though, are kept as
plain local shards (:class:`DTensorShardLinear`: each forward wraps them with ``DTensor.from_local``),
cut from the full deterministic block with :class:`~hetplan.models.gpt_tp.ShardSpec` in the plan's
member order: the runtime's gradient groups, global norm, mixed precision and checkpoints all work
on local shards and ``tp_specs`` and apply unchanged. Heads: a layer such as ``LlamaAttention``
reshapes with ``-1`` heads, so a member with ``1/t`` of q, k and v computes ``1/t`` of the heads,
as ``transformers``' own TP does.

Without a process group to build a mesh on (the profiler timing one member's compute alone), or on
GPU ranks whose gloo collectives are staged through host memory, the same shards run with the
conjugate operators ``f`` / ``g`` of :mod:`hetplan.models.gpt_tp` instead (:class:`ColwiseLinear`,
:class:`RowwiseLinear`): the same arithmetic, without DTensor.

Only ``nn.Linear`` layers are cut; a plan naming anything else, or a model without a plan at degree
above 1, is refused with one line.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn

from hetplan.errors import HetplanError
from hetplan.models.base import ZooModel
from hetplan.models.gpt_tp import ShardSpec, TpGroup, copy_to_group, reduce_from_group, shard_block

__all__ = ["ColwiseLinear", "DTensorShardLinear", "RowwiseLinear", "has_tp_form", "shard_model_block"]

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


class DTensorShardLinear(nn.Linear):
    """A Linear that ``parallelize_module`` made parallel, holding its shards as plain parameters:
    each forward views them as the DTensors the style placed (``from_local``, no communication),
    so autograd gives each member its local gradient and the style's hooks do the collectives."""

    _tp_mesh: Any
    _tp_placements: dict[str, Any]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        def view(name: str) -> Any:
            value = getattr(self, name)
            if value is None:
                return None
            return DTensor.from_local(value, self._tp_mesh, self._tp_placements[name], run_check=False)

        return F.linear(x, view("weight"), view("bias"))


def _dtensor_mesh(group: TpGroup) -> Any:
    """A 1-D DeviceMesh over the member's process group, or None where the DTensor path is not used:
    no group (the profiler), or gloo on a machine with GPUs (host-staged device tensors)."""
    if group.pg is None or not group.communicate:
        return None
    from torch.distributed.device_mesh import DeviceMesh

    backend = str(dist.get_backend(group.pg))
    if backend == "nccl":
        return DeviceMesh.from_group(group.pg, "cuda")
    if torch.cuda.is_available():
        return None
    return DeviceMesh.from_group(group.pg, "cpu")


def _parallelize(block: nn.Module, plan: dict[str, str], group: TpGroup, mesh: Any) -> None:
    """``parallelize_module`` on the planned layers, then each layer's DTensor parameters replaced by
    this member's shard (plan order) as a plain parameter, viewed as that DTensor in the forward.

    Why the shards are cut here rather than kept from ``distribute_tensor``: the mesh orders members
    by their rank in the process group, the plan by their place in the replica
    (``TpGroup.rank``); only all-reduces cross the members, which do not depend on the order, so
    any member may hold any shard as long as checkpoints and gradient groups agree on the plan's."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    fulls = {path: (block.get_submodule(path).weight.detach(), block.get_submodule(path).bias) for path in plan}
    styles = {path: ColwiseParallel() if style == "colwise" else RowwiseParallel() for path, style in plan.items()}
    parallelize_module(block, mesh, styles)
    for path, style in plan.items():
        layer = block.get_submodule(path)
        weight, bias = fulls[path]
        placements = {"weight": layer.weight.placements}
        layer._parameters["weight"] = nn.Parameter(
            ShardSpec(0 if style == "colwise" else 1).cut(weight, group.size, group.rank)
        )
        if bias is not None:
            placements["bias"] = layer.bias.placements
            local = (
                ShardSpec(0).cut(bias.detach(), group.size, group.rank) if style == "colwise" else bias.detach().clone()
            )
            layer._parameters["bias"] = nn.Parameter(local)
        layer.__class__ = DTensorShardLinear
        layer._tp_mesh, layer._tp_placements = mesh, placements


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
        spec = ShardSpec(0 if style == "colwise" else 1)
        spec.cut(full.weight.detach(), group.size, group.rank)  # one line where it does not split
        specs[f"{path}.weight"] = spec
        if full.bias is not None and style == "colwise":
            specs[f"{path}.bias"] = ShardSpec(0)
    mesh = _dtensor_mesh(group)
    if mesh is not None:
        _parallelize(block, dict(plan), group, mesh)
    else:
        for path, style in sorted(plan.items()):
            full = block.get_submodule(path)
            part: nn.Module = ColwiseLinear(full, group) if style == "colwise" else RowwiseLinear(full, group)
            parent_path, _, attr = path.rpartition(".")
            setattr(block.get_submodule(parent_path) if parent_path else block, attr, part.train(full.training))
    block.tp_specs = specs  # type: ignore[assignment]
    block.group = group  # type: ignore[assignment]  # checkpoints gather a shard's parts over it
    return block


def _what(zoo: ZooModel) -> str:
    model: dict[str, Any] = zoo.model
    return str(model.get("factory") or model.get("hf") or model.get("family") or "the model")

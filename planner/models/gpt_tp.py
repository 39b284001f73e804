"""Megatron-style tensor-parallel versions of the zoo GPT's attention and MLP blocks.

    group = TpGroup(pg, size=2, rank=1)                 # the member's process group and its shard
    block = shard_block(zoo.build_block(3, seed), group)  # TpAttention / TpMlp, or the block itself
    block.tp_specs                                       # {"qkv.weight": ShardSpec(0, 3), ...}

A block is cut from the **same** deterministic full block a one-process run builds
(:meth:`ZooModel.build_block`), so a tensor-parallel run trains the one-process model: member ``r``
of ``t`` keeps heads ``[r·a/t, (r+1)·a/t)`` of the QKV projection (column-parallel: the rows of q, k
and v for its heads), the matching input columns of the output projection (row-parallel), rows
``[r·4h/t, (r+1)·4h/t)`` of the MLP's up-projection and those columns of its down-projection. The
LayerNorms and the row-parallel biases stay whole on every member (replicated), the bias added once
after the all-reduce.

The conjugate operators of Megatron (Shoeybi et al. 2019, section 3) are autograd functions with
explicit collectives on the group's process group: ``f`` (:func:`copy_to_group`) is the identity in
forward and an all-reduce of the gradient in backward, placed where the replicated input enters the
column-parallel layer; ``g`` (:func:`reduce_from_group`) all-reduces the partial outputs of the
row-parallel layer in forward and is the identity in backward. Without sequence parallelism every
member therefore holds the whole block input and output, and the gradients reaching the replicated
parameters (LayerNorm, bias) are the same on every member: ``f``'s all-reduce makes the gradient
entering the LayerNorm whole before it is used.

Blocks without a tensor-parallel form (embedding, head, other families) are returned as they are:
replicated inside the group, computed whole by every member (Megatron's vocabulary-parallel
embedding and head are not implemented).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn

from hetplan.errors import HetplanError
from hetplan.models.gpt import Attention, Mlp, attention_core

__all__ = [
    "ShardSpec",
    "TpAttention",
    "TpGroup",
    "TpMlp",
    "copy_to_group",
    "reduce_from_group",
    "shard_block",
    "shard_specs",
]


@dataclass(frozen=True)
class TpGroup:
    """One member's view of its tensor-parallel group.

    ``rank`` is the member's shard (its place in the plan's replica, which decides which slice it
    keeps and which gradient group it joins); ``order[i]`` is the shard of the process at group rank
    ``i`` of ``pg`` (torch orders a group's ranks by global rank, which need not be the plan's order).
    """

    pg: dist.ProcessGroup | None
    size: int
    rank: int
    order: tuple[int, ...] = ()
    #: False: the collectives are left out (each member's compute alone, as the profiler times it)
    communicate: bool = True

    def gather(self, local: torch.Tensor) -> list[torch.Tensor]:
        """Every member's ``local`` (same shape), in shard order (a collective of the group)."""
        if self.size == 1:
            return [local]
        local = local.contiguous()
        parts = [torch.empty_like(local) for _ in range(self.size)]
        dist.all_gather(parts, local, group=self.pg)
        order = self.order or tuple(range(self.size))
        by_shard: list[torch.Tensor] = [local] * self.size
        for i, shard in enumerate(order):
            by_shard[shard] = parts[i]
        return by_shard


@dataclass(frozen=True)
class ShardSpec:
    """How a full parameter is cut: dimension ``dim`` seen as ``(groups, t, n / (groups·t))``, member
    ``r`` keeping index ``r`` of the middle axis (``groups=3`` cuts q, k and v of a fused QKV alike)."""

    dim: int
    groups: int = 1

    def _view(self, shape: tuple[int, ...], t: int) -> tuple[int, ...]:
        n = shape[self.dim]
        if n % (self.groups * t):
            raise HetplanError(f"a dimension of {n} does not split {self.groups}x{t} ways", field="tensor_parallel")
        return (*shape[: self.dim], self.groups, t, n // (self.groups * t), *shape[self.dim + 1 :])

    def cut(self, full: torch.Tensor, t: int, r: int) -> torch.Tensor:
        """Member ``r``'s shard of ``full`` (a copy)."""
        view = full.reshape(self._view(tuple(full.shape), t))
        local = view.select(self.dim + 1, r)
        shape = list(full.shape)
        shape[self.dim] //= t
        return local.reshape(shape).clone()

    def join(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The full tensor from every member's shard, in shard order."""
        t = len(parts)
        n = parts[0].shape[self.dim]
        views = [
            p.reshape(*p.shape[: self.dim], self.groups, 1, n // self.groups, *p.shape[self.dim + 1 :]) for p in parts
        ]
        full = torch.cat(views, dim=self.dim + 1)
        shape = list(parts[0].shape)
        shape[self.dim] *= t
        return full.reshape(shape)

    def full_shape(self, local: tuple[int, ...], t: int) -> tuple[int, ...]:
        shape = list(local)
        shape[self.dim] *= t
        return tuple(shape)


# -- the conjugate operators f and g ---------------------------------------------------------------


class _CopyToGroup(torch.autograd.Function):
    """``f``: identity forward, all-reduce (sum) of the gradient over the group backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: TpGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        out = grad.contiguous().clone()
        if ctx.group.communicate:
            dist.all_reduce(out, group=ctx.group.pg)
        return out, None


class _ReduceFromGroup(torch.autograd.Function):
    """``g``: all-reduce (sum) of the partial outputs forward, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: TpGroup) -> torch.Tensor:
        out = x.contiguous().clone()
        if group.communicate:
            dist.all_reduce(out, group=group.pg)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def copy_to_group(x: torch.Tensor, group: TpGroup) -> torch.Tensor:
    return x if group.size == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x: torch.Tensor, group: TpGroup) -> torch.Tensor:
    return x if group.size == 1 else _ReduceFromGroup.apply(x, group)


# -- the blocks ---------------------------------------------------------------------------------------


def _linear(n_in: int, n_out: int, like: nn.Linear) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=like.bias is not None, device="meta").to_empty(device=like.weight.device)


class TpAttention(nn.Module):
    """Member ``group.rank`` of a tensor-parallel :class:`~hetplan.models.gpt.Attention`.

    Parameter names are the full block's (``norm.*``, ``qkv.*``, ``proj.*``), so a checkpoint keyed
    by them holds the full tensors (:attr:`tp_specs` says how each is cut).
    """

    tp_specs: ClassVar[dict[str, ShardSpec]] = {
        "qkv.weight": ShardSpec(0, 3),
        "qkv.bias": ShardSpec(0, 3),
        "proj.weight": ShardSpec(1),
    }

    def __init__(self, full: Attention, group: TpGroup) -> None:
        super().__init__()
        t, r = group.size, group.rank
        h = full.qkv.in_features
        if full.heads % t:
            raise HetplanError(f"{full.heads} heads do not split over tensor_parallel {t}", field="tensor_parallel")
        self.group = group
        self.heads = full.heads // t
        self.norm = full.norm
        self.qkv = _linear(h, 3 * h // t, full.qkv)
        self.proj = _linear(h // t, h, full.proj)
        with torch.no_grad():
            for name, spec in self.tp_specs.items():
                self.get_parameter(name).copy_(spec.cut(full.get_parameter(name), t, r))
            self.proj.bias.copy_(full.proj.bias)
        self.register_buffer("mask", full.mask, persistent=False)
        self.recompute_core = False
        self.fused = full.fused

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, t, _ = x.shape
        local = self.qkv.out_features // 3
        q, k, v = self.qkv(copy_to_group(self.norm(x), self.group)).split(local, dim=-1)
        y = attention_core(q, k, v, self.heads, self.mask[:t, :t], recompute=self.recompute_core, fused=self.fused)
        return x + (reduce_from_group(F.linear(y, self.proj.weight), self.group) + self.proj.bias)


class TpMlp(nn.Module):
    """Member ``group.rank`` of a tensor-parallel :class:`~hetplan.models.gpt.Mlp`."""

    tp_specs: ClassVar[dict[str, ShardSpec]] = {
        "up.weight": ShardSpec(0),
        "up.bias": ShardSpec(0),
        "down.weight": ShardSpec(1),
    }

    def __init__(self, full: Mlp, group: TpGroup) -> None:
        super().__init__()
        t, r = group.size, group.rank
        h, f = full.up.in_features, full.up.out_features
        if f % t:
            raise HetplanError(f"an MLP of width {f} does not split over tensor_parallel {t}", field="tensor_parallel")
        self.group = group
        self.norm = full.norm
        self.up = _linear(h, f // t, full.up)
        self.act = full.act
        self.down = _linear(f // t, h, full.down)
        with torch.no_grad():
            for name, spec in self.tp_specs.items():
                self.get_parameter(name).copy_(spec.cut(full.get_parameter(name), t, r))
            self.down.bias.copy_(full.down.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.act(self.up(copy_to_group(self.norm(x), self.group)))
        return x + (reduce_from_group(F.linear(y, self.down.weight), self.group) + self.down.bias)


def shard_block(block: nn.Module, group: TpGroup) -> nn.Module:
    """``block``'s member for ``group``: a :class:`TpAttention` or :class:`TpMlp`, or the block
    itself (replicated) where it has no tensor-parallel form. Keeps training mode."""
    if group.size == 1:
        return block
    if isinstance(block, Attention):
        return TpAttention(block, group).train(block.training)
    if isinstance(block, Mlp):
        return TpMlp(block, group).train(block.training)
    return block


def shard_specs(block: nn.Module) -> dict[str, ShardSpec]:
    """How each of ``block``'s parameters is cut (empty: nothing sharded)."""
    return dict(getattr(block, "tp_specs", {}))

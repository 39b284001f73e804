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

Vocabulary parallelism (Megatron's ``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy``;
Shoeybi et al. 2019, section 3), where the group says so (``TpGroup.vocab``, from the plan's stage
key ``vocab_parallel``, on by default at degree > 1): member ``r`` keeps rows ``[r·n, (r+1)·n)`` of
the token table, ``n = ceil(V/t)`` (the table padded with zero rows to ``n·t``; a padded row is never
looked up, its logit is ``-inf`` in the loss, so its gradient stays zero and the model trained is
the one-process model; checkpoints hold the ``V`` real rows, :class:`VocabShardSpec`). The embedding
looks up only its own ids (the others give zero rows) and all-reduces the sum (``g``); the position
table stays whole. The head keeps the same rows of its output projection (``f`` on its input),
returns its ``[.., n]`` slice of the logits, and :meth:`VocabParallelHead.loss` is the cross-entropy
over the group: all-reduces of the row maximum, then of the target logit and the sum of exponentials,
so no member ever holds ``[s, V]`` logits. Without ``vocab`` the embedding and head (and the blocks
of other families) are returned as they are: replicated, computed whole by every member.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F  # noqa: N812
from torch import nn

from hetplan.errors import HetplanError
from hetplan.models.gpt import Attention, Embedding, Head, Mlp, attention_core

__all__ = [
    "ShardSpec",
    "TpAttention",
    "TpGroup",
    "TpMlp",
    "VocabParallelEmbedding",
    "VocabParallelHead",
    "VocabShardSpec",
    "copy_to_group",
    "loss_of",
    "reduce_from_group",
    "shard_block",
    "shard_specs",
    "vocab_parallel_cross_entropy",
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
    #: True: the zoo GPT's embedding and head are cut by vocabulary rows (else replicated)
    vocab: bool = False

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


@dataclass(frozen=True)
class VocabShardSpec(ShardSpec):
    """Rows of a ``vocab``-row table cut ``t`` ways when ``t`` need not divide ``vocab``: the table is
    padded with zero rows to ``n·t`` (``n = ceil(vocab / t)``), member ``r`` keeping rows ``[r·n,
    (r+1)·n)``; joined, the padding is dropped, so a checkpoint holds the ``vocab`` real rows."""

    vocab: int = 0

    def cut(self, full: torch.Tensor, t: int, r: int) -> torch.Tensor:
        n = -(-self.vocab // t)
        local = full.new_zeros((n, *full.shape[1:]))
        lo, hi = min(self.vocab, r * n), min(self.vocab, (r + 1) * n)
        local[: hi - lo] = full[lo:hi]
        return local

    def join(self, parts: list[torch.Tensor]) -> torch.Tensor:
        return torch.cat(parts, dim=0)[: self.vocab]

    def full_shape(self, local: tuple[int, ...], t: int) -> tuple[int, ...]:
        return (self.vocab, *local[1:])


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


# -- vocabulary parallelism -------------------------------------------------------------------------


def _vocab_rows(vocab: int, group: TpGroup) -> tuple[int, int, int]:
    """``(n, lo, valid)``: rows per member, the member's first row, how many of its rows are real."""
    n = -(-vocab // group.size)
    lo = group.rank * n
    return n, lo, max(0, min(vocab, lo + n) - lo)


class VocabParallelEmbedding(nn.Module):
    """Member ``group.rank`` of the zoo GPT's :class:`~hetplan.models.gpt.Embedding`: its rows of the
    token table; the position table whole (replicated, as Megatron keeps it)."""

    def __init__(self, full: Embedding, group: TpGroup) -> None:
        super().__init__()
        vocab, h = full.tokens.weight.shape
        self.group = group
        self.tp_specs = {"tokens.weight": VocabShardSpec(0, vocab=vocab)}
        self.rows, self.lo, _ = _vocab_rows(vocab, group)
        self.tokens = nn.Embedding(self.rows, h, device="meta").to_empty(device=full.tokens.weight.device)
        with torch.no_grad():
            self.tokens.weight.copy_(self.tp_specs["tokens.weight"].cut(full.tokens.weight, group.size, group.rank))
        self.positions = full.positions

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.lo
        outside = (local < 0) | (local >= self.rows)
        y = F.embedding(local.masked_fill(outside, 0), self.tokens.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        positions = torch.arange(ids.shape[1], device=ids.device)
        return reduce_from_group(y, self.group) + self.positions(positions)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-row cross-entropy of logits split by columns over the group (Megatron's
    ``_VocabParallelCrossEntropy``): keeps only this member's softmax slice for backward."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, group: TpGroup, lo: int, valid: int):
        n = logits.shape[-1]
        # the row maximum over real columns (-inf on a member holding padding only)
        top = logits[:, :valid].max(dim=-1).values if valid else logits.new_full(logits.shape[:-1], float("-inf"))
        if group.communicate:
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group.pg)
        softmax = logits - top.unsqueeze(-1)
        if valid < n:
            softmax[:, valid:] = float("-inf")
        local = targets - lo
        inside = (local >= 0) & (local < valid)
        index = local.masked_fill(~inside, 0)
        picked = softmax.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(~inside, 0.0)
        softmax.exp_()
        sums = torch.stack([picked, softmax.sum(dim=-1)])  # one all-reduce for both
        if group.communicate:
            dist.all_reduce(sums, group=group.pg)
        softmax.div_(sums[1].unsqueeze(-1))
        ctx.save_for_backward(softmax, index, inside)
        return sums[1].log() - sums[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        softmax, index, inside = ctx.saved_tensors
        out = softmax  # used once: the gradient is written over it, as Megatron does
        rows = torch.arange(out.shape[0], device=out.device)
        out[rows, index] -= inside.to(out.dtype)
        out.mul_(grad.unsqueeze(-1))
        return out, None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, group: TpGroup, *, lo: int, valid: int
) -> torch.Tensor:
    """Per-row loss of ``logits [N, n]``, this member's columns ``[lo, lo + n)`` of the vocabulary
    (the first ``valid`` real, the rest padding), against ``targets [N]`` (full vocabulary ids)."""
    return _VocabParallelCrossEntropy.apply(logits, targets, group, lo, valid)


class VocabParallelHead(nn.Module):
    """Member ``group.rank`` of the zoo GPT's :class:`~hetplan.models.gpt.Head`: the final LayerNorm
    whole, its rows of the LM head; returns its slice of the logits, ``[B, t, n]``, which only
    :meth:`loss` reads."""

    def __init__(self, full: Head, group: TpGroup) -> None:
        super().__init__()
        vocab, h = full.lm.weight.shape
        self.group = group
        self.vocab = vocab
        self.tp_specs = {"lm.weight": VocabShardSpec(0, vocab=vocab)}
        rows, self.lo, self.valid = _vocab_rows(vocab, group)
        self.norm = full.norm
        self.lm = nn.Linear(h, rows, bias=False, device="meta").to_empty(device=full.lm.weight.device)
        with torch.no_grad():
            self.lm.weight.copy_(self.tp_specs["lm.weight"].cut(full.lm.weight, group.size, group.rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm(copy_to_group(self.norm(x), self.group))

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The zoo GPT's loss (:meth:`hetplan.models.gpt.GptModel.loss`: cross-entropy in fp32, mean
        over a sample's tokens, summed over samples) from this member's logits, over the group."""
        rows = output.float().reshape(-1, output.shape[-1])
        per_token = vocab_parallel_cross_entropy(rows, targets.reshape(-1), self.group, lo=self.lo, valid=self.valid)
        return per_token.reshape(targets.shape[0], -1).mean(dim=1).sum()


def loss_of(zoo_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], last: nn.Module):
    """The loss a last stage computes from its output: a vocabulary-parallel head's own (it needs its
    group), else the model's ``zoo_loss``."""
    return last.loss if isinstance(last, VocabParallelHead) else zoo_loss


def shard_block(block: nn.Module, group: TpGroup) -> nn.Module:
    """``block``'s member for ``group``: a :class:`TpAttention` or :class:`TpMlp`, with
    ``group.vocab`` a :class:`VocabParallelEmbedding` or :class:`VocabParallelHead`, or the block
    itself (replicated) where it has no tensor-parallel form. Keeps training mode."""
    if group.size == 1:
        return block
    if isinstance(block, Attention):
        return TpAttention(block, group).train(block.training)
    if isinstance(block, Mlp):
        return TpMlp(block, group).train(block.training)
    if group.vocab and isinstance(block, Embedding):
        return VocabParallelEmbedding(block, group).train(block.training)
    if group.vocab and isinstance(block, Head):
        return VocabParallelHead(block, group).train(block.training)
    return block


def shard_specs(block: nn.Module) -> dict[str, ShardSpec]:
    """How each of ``block``'s parameters is cut (empty: nothing sharded)."""
    return dict(getattr(block, "tp_specs", {}))

"""How one gradient group's holders combine their gradients, by sync mode: all-reduce, top-k, Adasum.

    sync = make_group_sync("topk", ratio=0.01)              # or "allreduce", or "adasum" (+ pipelines)
    pending = sync.issue(gid, flat, pg, timeout_s=60)        # asynchronous, from the gradient hooks
    flat = sync.complete(pending)                            # at ``OPT``: the combined gradient

Every holder's ``flat`` is its gradient contribution already weighted as the runtime weights it for
the all-reduce (its samples over the global batch), so the plain sum over holders is the whole
batch's mean gradient. The modes differ only in how they combine:

* ``allreduce``: ``torch.distributed.all_reduce`` (sum): exact.
* ``topk``: each holder sends the ``k`` largest entries of its contribution plus its residual
  (:class:`hetplan.runtime.sync.topk.TopK`, error feedback), every holder all-gathers every holder's
  (indices, values) and adds them up in group-rank order. Ratio 1 is the all-reduce's sum.
* ``adasum``: each pipeline's holders sum their contributions (a replicated stage), turn it into the
  pipeline's mean gradient, and the pipelines combine them by Adasum tensor by tensor, weighted by
  their batch shares, pairwise up a binary tree, the root broadcasting the result
  (:class:`hetplan.runtime.sync.adasum.AdasumTree`: one receive buffer per rank, never ``n`` copies).

Top-k's all-gathers carry ``n`` contributions where a ring all-reduce moves two; the simulator
charges Adasum as an all-gather too (docs/cost-model.md), where its tree moves
``ceil(log2 n) + 1`` vectors one after the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetplan.runtime.comm import wait
from hetplan.runtime.sync.adasum import AdasumTree
from hetplan.runtime.sync.topk import TopK, densify

__all__ = ["AdasumSync", "AllReduceSync", "GroupLayout", "Pending", "TopKSync", "make_group_sync"]


@dataclass(frozen=True)
class GroupLayout:
    """What Adasum needs of a group: each group rank's pipeline, the pipelines' batches, the
    sizes of the tensors in ``flat`` (in order)."""

    pipeline_of_rank: tuple[int, ...]
    batches: Mapping[int, int]
    sizes: tuple[int, ...]


@dataclass
class Pending:
    gid: int
    work: Any
    flat: torch.Tensor
    parts: list[torch.Tensor]
    timeout_s: float
    what: str


class AllReduceSync:
    """The exact sum (today's behaviour)."""

    name = "allreduce"

    def wire(self, flat: torch.Tensor, n: int) -> tuple[str, float]:
        """What crosses the links: the collective and its bytes (an all-gather's total), for pacing."""
        return "allreduce", flat.numel() * flat.element_size()

    def issue(self, gid: int, flat: torch.Tensor, pg: Any, *, timeout_s: float, what: str = "") -> Pending:
        return Pending(gid, dist.all_reduce(flat, group=pg, async_op=True), flat, [], timeout_s, what or f"AR{gid}")

    def complete(self, pending: Pending) -> torch.Tensor:
        wait(pending.work, timeout_s=pending.timeout_s, what=pending.what)
        return pending.flat


class TopKSync:
    """Top-k with error feedback; the residual of each group is kept across steps."""

    name = "topk"

    def __init__(self, ratio: float) -> None:
        self.compressor = TopK(ratio)

    def wire(self, flat: torch.Tensor, n: int) -> tuple[str, float]:
        return "allgather", n * self.compressor.k_of(flat.numel()) * (8 + flat.element_size())

    def issue(self, gid: int, flat: torch.Tensor, pg: Any, *, timeout_s: float, what: str = "") -> Pending:
        idx, val = self.compressor.compress(f"group{gid}", flat)
        n = dist.get_world_size(pg)
        idx_parts = [torch.empty_like(idx) for _ in range(n)]
        val_parts = [torch.empty_like(val) for _ in range(n)]
        works = (
            dist.all_gather(idx_parts, idx, group=pg, async_op=True),
            dist.all_gather(val_parts, val, group=pg, async_op=True),
        )
        return Pending(gid, works, flat, [*idx_parts, *val_parts], timeout_s, what or f"AR{gid}")

    def complete(self, pending: Pending) -> torch.Tensor:
        for work in pending.work:
            wait(work, timeout_s=pending.timeout_s, what=pending.what)
        n = len(pending.parts) // 2
        pairs = [(pending.parts[i], pending.parts[n + i]) for i in range(n)]
        dense = densify(pairs, pending.flat.numel()).to(pending.flat.dtype)
        pending.flat.copy_(dense)
        return pending.flat

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The residual per group (``group<id>``), on the host: what a checkpoint keeps per device."""
        return self.compressor.state_dict()

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.compressor.load_state_dict(state)

    def state_tensors(self) -> list[torch.Tensor]:
        """The residuals kept from step to step, where they live (for memory accounting)."""
        return list(self.compressor.residual.values())

    def step_done(self, *, skipped: bool) -> None:
        """After ``OPT``: a step skipped everywhere (an overflow) gives every residual back."""
        if skipped:
            self.compressor.rollback()
        else:
            self.compressor.commit()


class AdasumSync:
    """Adasum across pipelines (see the module doc); ``layouts`` per group id."""

    name = "adasum"

    def __init__(self, layouts: Mapping[int, GroupLayout], *, deltas: bool = False) -> None:
        self.layouts = dict(layouts)
        # deltas (an adaptive optimizer): the gradients are summed inside each pipeline only; the
        # pipelines' parameter changes are combined after their own steps (hetplan.runtime.sync.adasum_step)
        self.deltas = deltas
        self._trees: dict[int, AdasumTree] = {}

    def wire(self, flat: torch.Tensor, n: int) -> tuple[str, float]:
        return "allgather", n * flat.numel() * flat.element_size()

    def tree(self, gid: int, pg: Any) -> AdasumTree:
        """Group ``gid``'s tree (its ranks read from ``pg``: the whole world when None)."""
        if gid not in self._trees:
            layout = self.layouts[gid]
            ranks = dist.get_process_group_ranks(pg) if pg is not None else list(range(dist.get_world_size()))
            self._trees[gid] = AdasumTree(sorted(ranks), layout.pipeline_of_rank, layout.batches, layout.sizes)
        return self._trees[gid]

    def issue(self, gid: int, flat: torch.Tensor, pg: Any, *, timeout_s: float, what: str = "") -> Pending:
        """Nothing leaves yet: the tree's point-to-point steps run at :meth:`complete`, in group order
        on every holder (so no two groups' messages interleave)."""
        return Pending(gid, pg, flat, [], timeout_s, what or f"AR{gid}")

    def complete(self, pending: Pending) -> torch.Tensor:
        tree = self.tree(pending.gid, pending.work)
        if self.deltas:
            return tree.pipeline_sum(pending.flat, pending.work, timeout_s=pending.timeout_s, what=pending.what)
        return tree.reduce(pending.flat, pending.work, timeout_s=pending.timeout_s, what=pending.what)


def make_group_sync(
    mode: str, *, ratio: float = 1.0, layouts: Mapping[int, GroupLayout] | None = None, deltas: bool = False
):
    """The combiner of ``mode`` (``allreduce``, ``topk`` or ``adasum``; ``deltas``: Adasum of the
    parameter changes, the gradients summed inside each pipeline only)."""
    if mode == "allreduce":
        return AllReduceSync()
    if mode == "topk":
        return TopKSync(ratio)
    if mode == "adasum":
        return AdasumSync(layouts or {}, deltas=deltas)
    raise ValueError(f"no gradient-group combiner for sync mode {mode!r}")

"""How one gradient group's holders combine their gradients, by sync mode: all-reduce, top-k, Adasum.

    sync = make_group_sync("topk", ratio=0.01)              # or "allreduce", or "adasum" (+ pipelines)
    pending = sync.issue(gid, flat, pg, timeout_s=60)        # asynchronous, from the gradient hooks
    flat = sync.complete(pending)                            # at ``OPT``: the combined gradient

Every holder's ``flat`` is its gradient contribution already weighted as the runtime weights it for
the all-reduce (its samples over the global batch), so the plain sum over holders is the whole
batch's mean gradient. The modes differ only in how they combine:

* ``allreduce``: ``torch.distributed.all_reduce`` (sum): exact.
* ``topk``: each holder sends the ``k`` largest entries of its contribution plus its residual
  (:class:`hetplan.runtime.topk.TopK`, error feedback), every holder all-gathers every holder's
  (indices, values) and adds them up in group-rank order. Ratio 1 is the all-reduce's sum.
* ``adasum``: every holder all-gathers every holder's contribution, sums each pipeline's (a pipeline
  with replicated stages has several holders), turns it back into that pipeline's mean gradient, and
  combines the pipelines' mean gradients by Adasum tensor by tensor, weighted by their batch shares
  (:func:`hetplan.runtime.adasum.weighted_adasum_tree`). Every holder computes the same bits (same inputs, same order).

The all-gathers carry ``n`` contributions where a ring all-reduce moves two: the cost the simulator
charges these modes (docs/cost-model.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetplan.runtime.adasum import weighted_adasum_tree
from hetplan.runtime.comm import wait
from hetplan.runtime.topk import TopK, densify

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
        return self.compressor.state_dict()


class AdasumSync:
    """Adasum across pipelines (see the module doc); ``layouts`` per group id."""

    name = "adasum"

    def __init__(self, layouts: Mapping[int, GroupLayout]) -> None:
        self.layouts = dict(layouts)

    def wire(self, flat: torch.Tensor, n: int) -> tuple[str, float]:
        return "allgather", n * flat.numel() * flat.element_size()

    def issue(self, gid: int, flat: torch.Tensor, pg: Any, *, timeout_s: float, what: str = "") -> Pending:
        n = dist.get_world_size(pg)
        parts = [torch.empty_like(flat) for _ in range(n)]
        work = dist.all_gather(parts, flat, group=pg, async_op=True)
        return Pending(gid, work, flat, parts, timeout_s, what or f"AR{gid}")

    def complete(self, pending: Pending) -> torch.Tensor:
        wait(pending.work, timeout_s=pending.timeout_s, what=pending.what)
        pending.flat.copy_(combine_adasum(pending.parts, self.layouts[pending.gid]))
        return pending.flat


def combine_adasum(parts: Sequence[torch.Tensor], layout: GroupLayout) -> torch.Tensor:
    """Every holder's weighted contribution -> the Adasum of the pipelines' mean gradients."""
    if len(parts) != len(layout.pipeline_of_rank):
        raise ValueError(f"expected {len(layout.pipeline_of_rank)} contributions, got {len(parts)}")
    total_batch = sum(layout.batches.values())
    sums: dict[int, torch.Tensor] = {}
    for part, p in zip(parts, layout.pipeline_of_rank, strict=True):
        sums[p] = sums[p] + part.double() if p in sums else part.double()
    pipelines = sorted(sums)
    batches = [layout.batches[p] for p in pipelines]
    # a pipeline's contributions sum to (b_p / B) x its mean gradient
    means = [sums[p] * (total_batch / layout.batches[p]) for p in pipelines]
    out = torch.empty_like(means[0])
    offset = 0
    for size in layout.sizes:  # tensor by tensor, as Horovod's Adasum
        out[offset : offset + size] = weighted_adasum_tree([x[offset : offset + size] for x in means], batches)
        offset += size
    if offset != out.numel():
        raise ValueError(f"tensor sizes cover {offset} of {out.numel()} elements")
    return out.to(parts[0].dtype)


def make_group_sync(mode: str, *, ratio: float = 1.0, layouts: Mapping[int, GroupLayout] | None = None):
    """The combiner of ``mode`` (``allreduce``, ``topk`` or ``adasum``)."""
    if mode == "allreduce":
        return AllReduceSync()
    if mode == "topk":
        return TopKSync(ratio)
    if mode == "adasum":
        return AdasumSync(layouts or {})
    raise ValueError(f"no gradient-group combiner for sync mode {mode!r}")

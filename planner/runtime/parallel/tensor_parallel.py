"""Tensor-parallel groups of a plan at run time: one process group per replica of a TP stage.

    tp = tensor_parallel_group(plan, rank_of, address)     # every rank calls it, in the same order
    blocks = [shard_block(b, tp) for b in full_blocks] if tp else full_blocks

Every rank creates every group (``torch.distributed.new_group`` must be called by all ranks, in the
same order: here pipelines, stages and replicas in plan order), and keeps its own. The member's
shard is its place in the plan's replica (``DeviceProgram.tp_rank``), which is also the gradient
group it all-reduces with (the k-th members of every holder replica,
:func:`hetplan.schedule.compile.gradient_groups`). The stage's ``vocab_parallel`` (on unless the plan
says ``false``) makes the zoo GPT's embedding and head vocabulary-parallel in the group
(:class:`~hetplan.models.gpt_tp.VocabParallelEmbedding`, :class:`~hetplan.models.gpt_tp.VocabParallelHead`).

Boundary tensors arrive split (:mod:`hetplan.schedule.boundary`): each member receives its chunk of
the flattened buffer and :func:`gather_boundary` all-gathers the rest from the group, padding the
last chunk where the group's degree does not divide the buffer's elements.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hetplan.contracts.plan import Plan
from hetplan.models.gpt_tp import TpGroup

__all__ = ["gather_boundary", "tensor_parallel_group"]


def tensor_parallel_group(plan: Plan, rank_of: dict[str, int], address: str) -> TpGroup | None:
    """Create the process group of every tensor-parallel replica; return ``address``'s (or None)."""
    mine: TpGroup | None = None
    for p in plan.pipelines:
        for s in p.stages:
            if s.tensor_parallel == 1:
                continue
            for replica in s.replicas:
                ranks = sorted(rank_of[a] for a in replica)
                pg = dist.new_group(ranks)
                if address in replica:
                    shard_of = {rank_of[a]: k for k, a in enumerate(replica)}
                    order = tuple(shard_of[r] for r in ranks)
                    mine = TpGroup(pg, len(replica), replica.index(address), order, vocab=s.vocab_parallel)
    return mine


def gather_boundary(buffer: torch.Tensor, tp: TpGroup) -> None:
    """Fill ``buffer`` (contiguous) from every member's chunk of it, in place: member ``k`` holds
    elements ``[k·size, (k+1)·size)`` of the flattened buffer, ``size = ceil(n / t)``; the chunks are
    padded to ``size`` for the all-gather (equal parts) and the padding dropped after."""
    flat = buffer.view(-1)
    n = flat.numel()
    size = -(-n // tp.size)
    lo = min(n, tp.rank * size)
    hi = min(n, lo + size)
    local = torch.zeros(size, dtype=flat.dtype, device=flat.device)
    local[: hi - lo] = flat[lo:hi]
    flat.copy_(torch.cat(tp.gather(local))[:n])

"""Tensor-parallel groups of a plan at run time: one process group per replica of a TP stage.

    tp = tensor_parallel_group(plan, rank_of, address)     # every rank calls it, in the same order
    blocks = [shard_block(b, tp) for b in full_blocks] if tp else full_blocks

Every rank creates every group (``torch.distributed.new_group`` must be called by all ranks, in the
same order: here pipelines, stages and replicas in plan order), and keeps its own. The member's
shard is its place in the plan's replica (``DeviceProgram.tp_rank``), which is also the gradient
group it all-reduces with (the k-th members of every holder replica,
:func:`hetplan.schedule.compile.gradient_groups`).
"""

from __future__ import annotations

import torch.distributed as dist

from hetplan.contracts.plan import Plan
from hetplan.models.gpt_tp import TpGroup

__all__ = ["tensor_parallel_group"]


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
                    mine = TpGroup(pg, len(replica), replica.index(address), order)
    return mine

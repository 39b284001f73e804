"""Tied parameters across stages: one value held by every rank that uses it, one gradient, one step.

    tied = TiedParams.create(zoo, compiled, rank_of, address, blocks)   # every rank, same order
    params = tied.unique(params)                # a parameter two local blocks share, listed once
    held = [p for p in held if not tied.owns(p)]   # kept out of the per-block gradient groups
    tied.all_reduce(precision, timeout_s=60.0, what="...")   # at OPT, before the norm and the step
    counted = tied.counted(counted)             # the norm counts each tied parameter once, job-wide

A group of tied parameters (an LM head tied to the embedding, a layer two blocks share) may sit on
several stages and replicas. Each rank holding a member keeps a copy, built with the canonical
member's values (:meth:`hetplan.models.base.ZooModel.build_block`), and only one ``Parameter`` when it
holds several members. Its gradient is the sum of every use: each holder's local gradient (already
the sum of its local uses) is all-reduced with SUM over the union of the holders, which is every
contribution exactly once; so the parameter stays out of the per-block gradient groups (that would
count a replica's contribution to the other block's group twice). Every holder then steps the same
value from the same gradient: the copies stay identical, as Megatron keeps its first and last
stage's word embeddings. The gradient norm counts the parameter on the lowest rank of its holders.

Tensor parallelism (the zoo GPT's ``head: tied``): every holder must hold the group's blocks at one
degree and cut them alike (``vocab_parallel``), so member ``k`` of the embedding's group and member
``k`` of the head's hold the same rows of the table (:class:`~hetplan.models.gpt_tp.VocabShardSpec`);
the gradient is summed per shard, over the holders at place ``k`` (one process group per shard, as
the gradient groups are), and a replicated (uncut) copy is counted in the norm by shard 0 only. Not
combined with ZeRO-1, the sync modes that do not sum gradients (top-k, Adasum, wsp, sdpipe), or the
tensor parallelism of other models (their plans cut layers, not tied tables): such plans are refused
with one line (:func:`check_tied_plan`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hetplan.contracts.plan import Plan
from hetplan.errors import HetplanError
from hetplan.models.base import ZooModel
from hetplan.models.gpt_tp import shard_specs
from hetplan.runtime.comm import wait
from hetplan.schedule.compile import CompiledPlan

__all__ = ["TiedParams", "check_tied_plan"]


def check_tied_plan(zoo: ZooModel, plan: Plan) -> None:
    """Refuse a plan whose parallelism cannot keep a tied parameter's copies equal."""
    if not zoo.tied_parameters():
        return
    names = zoo.block_names()
    tied = ", ".join(f"{names[g[0][0]]}/{g[0][1]}" for g in zoo.tied_parameters())
    if plan.zero == 1:
        raise HetplanError(f"the model ties parameters ({tied}); ZeRO-1 does not support that yet", field="zero")
    if plan.sync not in ("allreduce", None):
        raise HetplanError(
            f"the model ties parameters ({tied}); sync {plan.sync} does not sum their gradients, use allreduce",
            field="sync",
        )
    if not any(s.tensor_parallel > 1 for p in plan.pipelines for s in p.stages):
        return
    if "family" not in zoo.model:
        raise HetplanError(
            f"the model ties parameters ({tied}); tensor parallelism does not support that yet",
            field="tensor_parallel",
        )
    for group in zoo.tied_parameters():
        members = {b for b, _ in group}
        cuts = {
            (s.tensor_parallel, s.vocab_parallel or s.tensor_parallel == 1)
            for p in plan.pipelines
            for s in p.stages
            if any(s.start <= b < s.end for b in members)
        }
        if len(cuts) > 1:
            seen = ", ".join(f"tensor_parallel {t}" + ("" if v else " (vocab_parallel false)") for t, v in sorted(cuts))
            raise HetplanError(
                f"the model ties {names[group[0][0]]}/{group[0][1]} to {names[group[-1][0]]}/{group[-1][1]}, "
                f"held at {seen}: every holder of a tied parameter needs one degree and one cut",
                field="pipelines[].stages[].tensor_parallel",
            )


@dataclass
class _Group:
    params: list[nn.Parameter]  # this rank's copy (one Parameter per group)
    pg: dist.ProcessGroup | None  # over every holder; None when this rank holds it alone
    lowest: bool  # this rank is the lowest-ranked holder: it counts the norm


class TiedParams:
    """This rank's tied parameters and the process groups that sum their gradients."""

    def __init__(self, groups: list[_Group]) -> None:
        self.groups = groups
        self._ids = {id(p) for g in groups for p in g.params}

    @classmethod
    def create(
        cls,
        zoo: ZooModel,
        compiled: CompiledPlan,
        rank_of: dict[str, int],
        address: str,
        blocks: dict[int, nn.Module],
    ) -> TiedParams:
        """Every rank calls this in the same place: it creates one process group per tied group and
        shard place held by more than one rank (``new_group`` is collective over the job), in group
        order, then place order."""
        out = []
        place = compiled.programs[address].tp_rank
        for group in zoo.tied_parameters():
            members = {b for b, _ in group}
            held_by = {a: p for a, p in compiled.programs.items() if any(p.start <= b < p.end for b in members)}
            mine = [blocks[b].get_parameter(name) for b, name in group if b in blocks]
            cut = any(name in shard_specs(blocks[b]) for b, name in group if b in blocks)
            # one group per shard place k: the k-th members of every holder (all of them at degree 1)
            for k in sorted({p.tp_rank for p in held_by.values()}):
                holders = sorted(rank_of[a] for a, p in held_by.items() if p.tp_rank == k)
                pg = dist.new_group(holders) if len(holders) > 1 else None
                if mine and k == place:
                    unique = list({id(p): p for p in mine}.values())
                    out.append(_Group(unique, pg, rank_of[address] == holders[0] and (cut or k == 0)))
        return cls(out)

    def owns(self, p: torch.Tensor) -> bool:
        """Whether ``p`` is one of this rank's tied parameters."""
        return id(p) in self._ids

    @staticmethod
    def unique(params: list[nn.Parameter]) -> list[nn.Parameter]:
        """``params`` with each Parameter once (two local blocks may hold the same one)."""
        return list({id(p): p for p in params}.values())

    def all_reduce(self, grad_of, *, device: torch.device, timeout_s: float, what: str) -> None:
        """Sum each tied parameter's gradient over its holders (``grad_of(p)``: the tensor the
        optimizer steps from; a missing one counts as zeros)."""
        for g in self.groups:
            if g.pg is None:
                continue
            for p in g.params:
                grad = grad_of(p)
                if grad is None:
                    grad = p.grad = torch.zeros_like(p)
                wait(dist.all_reduce(grad, group=g.pg, async_op=True), timeout_s=timeout_s, what=what)

    def counted(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """The norm's parameters: without tied ones, then each tied one on its lowest holder only."""
        out = [p for p in params if id(p) not in self._ids]
        seen = {id(p) for p in out}
        for g in self.groups:
            if g.lowest:
                out.extend(p for p in g.params if id(p) not in seen)
        return out

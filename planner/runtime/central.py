"""The central role of the decentralised sync modes, as one extra process of the job.

    central = central_layout(config)          # None for allreduce/adasum/topk; where the extra rank runs
    groups = mode_groups(config.plan, compiled, rank_of)      # every rank, central included, in order
    run_central(config, compiled, rank_of)    # the parameter server (wsp) or group scheduler (sdpipe)

``wsp`` needs a parameter server and ``sdpipe`` a group scheduler. Either runs as one more rank of the
job (world size = devices + 1), started by the same torchrun agent as the ranks of the first node of
the rank config: it is the ``LOCAL_RANK`` after that node's devices, and ``emit`` and ``launch``
start one more process there. It holds no device of the plan: it trains nothing, computes no
gradient, and every byte it moves goes over torch.distributed.

Process groups are created by every rank of a job in the same order (torch.distributed requires
it), the central rank included: :func:`mode_groups` is that order for the groups these modes add
(one per pipeline with more than one device, for the pipeline's own loss and gradient norm), after
the gradient groups (:func:`gradient_process_groups`), which the executor and this process create
alike.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from hetplan.contracts.plan import Plan
from hetplan.contracts.rank_config import RankConfig
from hetplan.models import resolve_model
from hetplan.runtime.group_scheduler import GroupScheduler
from hetplan.runtime.optim import clip_coefficient, make_optimizer
from hetplan.runtime.param_server import ParamServer
from hetplan.runtime.tensor_parallel import tensor_parallel_group
from hetplan.schedule.compile import CompiledPlan

__all__ = [
    "CENTRAL",
    "DECENTRALISED",
    "gradient_process_groups",
    "mode_groups",
    "param_names",
    "run_central",
]

#: The sync modes with a central role (and no job-wide all-reduce).
DECENTRALISED = ("wsp", "sdpipe")
#: The address the extra rank takes in place of a device's.
CENTRAL = "central"


def gradient_process_groups(compiled: CompiledPlan, rank_of: dict[str, int]) -> dict[int, Any]:
    """One process group per gradient group held by more than one device, in group order; every
    rank of the job calls this (members or not)."""
    out = {}
    for g in compiled.groups:
        if len(g.devices) > 1:
            out[g.id] = dist.new_group(sorted(rank_of[a] for a in g.devices))
    return out


def mode_groups(plan: Plan, compiled: CompiledPlan, rank_of: dict[str, int]) -> dict[int, Any]:
    """Per pipeline (with more than one device), the process group of its devices, for the
    decentralised modes' pipeline-local loss and norm; empty for the other modes."""
    if plan.sync not in DECENTRALISED:
        return {}
    out = {}
    for pi in range(len(plan.pipelines)):
        ranks = sorted(rank_of[a] for a, p in compiled.programs.items() if p.pipeline == pi)
        if len(ranks) > 1:
            out[pi] = dist.new_group(ranks)
    return out


def param_names(zoo: Any, blocks: dict[int, torch.nn.Module]) -> list[str]:
    """``BLOCK/PARAM`` names of ``blocks``' parameters, in block order (the flat buffers' order)."""
    names = zoo.block_names()
    return [f"{names[i]}/{n}" for i in sorted(blocks) for n, _ in blocks[i].named_parameters()]


def run_central(config: RankConfig, compiled: CompiledPlan, rank_of: dict[str, int]) -> None:
    """Create the job's process groups as every rank does, then serve until every device stops."""
    tensor_parallel_group(config.plan, rank_of, CENTRAL)  # none for these modes; the order stays the ranks'
    gradient_process_groups(compiled, rank_of)
    mode_groups(config.plan, compiled, rank_of)
    plan = config.plan
    if plan.sync == "sdpipe":
        pipelines = {
            pi: sorted(rank_of[a] for a, p in compiled.programs.items() if p.pipeline == pi)
            for pi in range(len(plan.pipelines))
        }
        GroupScheduler(pipelines, group_size=int(plan.sync_option("group_size"))).serve()
        return
    zoo = resolve_model(config.model)
    blocks = dict(enumerate(zoo.build_blocks(0, config.n_blocks, config.seed)))
    names = param_names(zoo, blocks)
    params = dict(zip(names, (p for i in sorted(blocks) for p in blocks[i].parameters()), strict=True))
    layouts = {
        rank_of[a]: param_names(zoo, {i: blocks[i] for i in range(e.start, e.end)}) for a, e in config.devices.items()
    }
    optimizer = make_optimizer(config.optimizer, list(params.values()), config.lr, weight_decay=config.weight_decay)
    schedule = config.lr_by_step()
    server: ParamServer | None = None

    def before_step(grads: list[torch.Tensor]) -> float:
        """The clock's learning rate and global-norm clipping, on the whole summed gradient."""
        assert server is not None
        lr = schedule.lr_at(server.version)
        for group in optimizer.param_groups:
            group["lr"] = lr
        sq = sum(float(torch.linalg.vector_norm(g, 2).double().square()) for g in grads)
        return clip_coefficient(math.sqrt(sq), config.clip_grad_norm)

    server = ParamServer(params, layouts, optimizer=optimizer, before_step=before_step)
    server.serve()

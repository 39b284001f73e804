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
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetplan.contracts.plan import Plan
from hetplan.contracts.rank_config import RankConfig
from hetplan.models import resolve_model
from hetplan.runtime.checkpoint import checkpoint_state, load_checkpoint, save_checkpoint
from hetplan.runtime.device.pacing import CENTRAL  # the address the extra rank takes in place of a device's
from hetplan.runtime.memtrack import measure_peak
from hetplan.runtime.optim import clip_coefficient
from hetplan.runtime.parallel.tensor_parallel import tensor_parallel_group
from hetplan.runtime.precision import Precision
from hetplan.runtime.sync.group_scheduler import GroupScheduler
from hetplan.runtime.sync.param_server import ParamServer
from hetplan.runtime.weights.materialise import build_rank_blocks
from hetplan.schedule.compile import CompiledPlan

__all__ = [
    "CENTRAL",
    "DECENTRALISED",
    "CentralCheckpoints",
    "device_transfer_group",
    "gradient_process_groups",
    "mode_groups",
    "param_names",
    "process_group_backend",
    "run_central",
]

#: The sync modes with a central role (and no job-wide all-reduce).
DECENTRALISED = ("wsp", "sdpipe")


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


def process_group_backend(backend: str, *, central: bool) -> str:
    """The backend string of the job's default process group: ``backend``, or, for NCCL in a job
    with a central process (wsp, sdpipe), the device-type map ``cpu:gloo,cuda:nccl``.

    The central process holds no GPU and every exchange with it (and SDPipe's weight swap) moves
    CPU tensors (:func:`hetplan.runtime.sync.param_server.to_host`): under the map torch.distributed sends
    CPU tensors over gloo and CUDA tensors (pipeline transfers, the pipeline's own collectives) over
    NCCL, on the same groups. Object collectives (the address exchange) pick gloo too, since the
    map names ``cpu``."""
    if backend == "nccl" and central:
        return "cpu:gloo,cuda:nccl"
    return backend


def device_transfer_group(rank_of: dict[str, int]) -> Any:
    """Under the ``cpu:gloo,cuda:nccl`` map, the group of every device rank (the central process
    left out), for the pipelines' CUDA transfers: NCCL builds a batched point-to-point's
    communicator over the whole group it is called on, and the central process, which has no GPU and
    sends no CUDA tensor, would never join one of the default group. None otherwise (the default
    group). Every rank calls this, the central one included, after :func:`mode_groups`."""
    if "nccl" not in str(dist.get_backend()) or "gloo" not in str(dist.get_backend()):
        return None
    return dist.new_group(sorted(rank_of.values()))


def param_names(zoo: Any, blocks: dict[int, torch.nn.Module]) -> list[str]:
    """``BLOCK/PARAM`` names of ``blocks``' parameters, in block order (the flat buffers' order)."""
    names = zoo.block_names()
    return [f"{names[i]}/{n}" for i in sorted(blocks) for n, _ in blocks[i].named_parameters()]


@dataclass(frozen=True)
class CentralCheckpoints:
    """The checkpoints a ``wsp`` run's parameter server takes part in (worker ``--save``/``--resume``).

    The server holds the newest fp32 weights and the optimizer state: it writes them (keyed by block,
    ``<block>/param/<p>`` and ``<block>/optim/<p>/<key>``, as every other checkpoint) in the same
    collective ``dcp.save`` as the devices (which write only their blocks' buffers), and on resume
    loads them before answering its first pull. ``steps`` are the steps saved after (each a wave's end).
    """

    save: str | None
    steps: tuple[int, ...]
    keep_last: int | None
    resume: str | None
    resume_step: int | None
    group: Any  # the checkpoint process group (None: the default one)
    info: dict[str, Any]  # the manifest's description of the run, as the devices give it


def run_central(
    config: RankConfig,
    compiled: CompiledPlan,
    rank_of: dict[str, int],
    checkpoints: CentralCheckpoints | None = None,
) -> float | None:
    """Create the job's process groups as every rank does, then serve until every device stops.

    Returns the parameter server's peak of live tensor bytes over its first ``staleness + 2`` clocks
    (the optimizer state is made at the first step; by then as many clocks as the bound allows may
    be open), measured at the CPU allocator as a device's step is (:func:`measure_peak`); None for
    sdpipe's scheduler, which holds no tensors."""
    tensor_parallel_group(config.plan, rank_of, CENTRAL)  # none for these modes; the order stays the ranks'
    gradient_process_groups(compiled, rank_of)
    mode_groups(config.plan, compiled, rank_of)
    device_transfer_group(rank_of)
    plan = config.plan
    if plan.sync == "sdpipe":
        pipelines = {
            pi: sorted(rank_of[a] for a, p in compiled.programs.items() if p.pipeline == pi)
            for pi in range(len(plan.pipelines))
        }
        GroupScheduler(pipelines, group_size=int(plan.sync_option("group_size"))).serve()
        return None
    zoo = resolve_model(config.model)
    blocks = dict(enumerate(build_rank_blocks(zoo, 0, config.n_blocks, config.seed, init_from=config.init_from)))
    names = param_names(zoo, blocks)
    params = dict(zip(names, (p for i in sorted(blocks) for p in blocks[i].parameters()), strict=True))
    layouts = {
        rank_of[a]: param_names(zoo, {i: blocks[i] for i in range(e.start, e.end)}) for a, e in config.devices.items()
    }
    # the server's optimizer, held by an fp32 Precision so that checkpoints read and write it as a device's
    precision = Precision(
        "fp32", list(params.values()), optimizer=config.optimizer, lr=config.lr, weight_decay=config.weight_decay
    )
    optimizer = precision.optimizer
    schedule = config.lr_by_step()
    wave = int(plan.sync_option("wave"))
    version = 0
    saves: dict[int, Any] = {}
    if checkpoints is not None:
        if checkpoints.resume:
            manifest = load_checkpoint(
                checkpoints.resume,
                blocks,
                precision,
                names=zoo.block_names(),
                step=checkpoints.resume_step,
                model=config.model,
            )
            version = manifest.step // wave  # the worker checked that it is a wave's end
        if checkpoints.save:
            for step in checkpoints.steps:
                saves[step // wave] = lambda step=step: _save_server(checkpoints, blocks, precision, zoo, step)
    server: ParamServer | None = None

    def before_step(grads: list[torch.Tensor]) -> float:
        """The clock's learning rate and global-norm clipping, on the whole summed gradient."""
        assert server is not None
        lr = schedule.lr_at(server.version)
        for group in optimizer.param_groups:
            group["lr"] = lr
        sq = sum(float(torch.linalg.vector_norm(g, 2).double().square()) for g in grads)
        return clip_coefficient(math.sqrt(sq), config.clip_grad_norm)

    server = ParamServer(
        params, layouts, optimizer=optimizer, before_step=before_step, version=version, checkpoints=saves
    )
    window = version + int(plan.sync_option("staleness")) + 2
    state = [t for entry in optimizer.state.values() for t in entry.values() if torch.is_tensor(t)]  # a resume's
    peak, _ = measure_peak(
        lambda: server.serve(until_version=window), held=list(params.values()) + state, device=torch.device("cpu")
    )
    server.serve()
    return peak


def _save_server(
    checkpoints: CentralCheckpoints, blocks: dict[int, torch.nn.Module], precision: Precision, zoo: Any, step: int
) -> None:
    """The server's share of the checkpoint after ``step``: every block's parameters (the newest
    version) and optimizer state; the devices write the buffers (which the server never sees)."""
    names = zoo.block_names()
    state = checkpoint_state(blocks, precision, names)
    buffers = {
        f"{names[i]}/param/{k}"
        for i, b in blocks.items()
        for k in b.state_dict()
        if k not in dict(b.named_parameters())
    }
    state = {k: v for k, v in state.items() if k not in buffers}
    assert checkpoints.save is not None
    save_checkpoint(
        checkpoints.save,
        state,
        step=step,
        info=checkpoints.info,
        group=checkpoints.group,
        keep_last=checkpoints.keep_last,
    )

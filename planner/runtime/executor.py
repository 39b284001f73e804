"""Execute one rank's action list, step by step: forward, backward, send, receive, all-reduce, step.

Gradients are scaled so that one step equals a single-process step on the whole global batch: each
rank's loss is the SUM of its samples' losses divided by the global batch, micro-batches accumulate,
and each gradient group is all-reduced with SUM over every device that holds it (replicas and
pipelines alike); the shares of the batch are therefore weighted by their sample counts, exactly.

The action list is executed as its contract says (:mod:`hetplan.schedule.compile`), which is what
the simulator times and the validator checks:

* consecutive transfers are posted as one batch (``batch_isend_irecv``, as Megatron's
  ``send_forward_recv_backward``); a batch with a receive is waited on before the next action, a
  batch of sends alone completes in the background (its tensors are kept until it has);
* each gradient group's all-reduce is issued asynchronously from gradient hooks during the device's
  last backward, the moment the group's gradients are final (groups in id order, the same order
  on every rank, as DDP issues buckets), and waited on at ``OPT``;
* boundary tensors are dropped as soon as their consumer has run (a received activation after its
  backward, an output after the backward through it), so a 1F1B stage holds what the memory
  model says: at most ``min(S - s, M)`` micro-batches;
* every collective uses tensors on the rank's device (NCCL needs CUDA tensors).

At ``OPT`` one all-reduce over the job carries ``[loss, overflow count, squared gradient norm]``:
each rank adds the squares of the gradients of the blocks it is the lowest rank of the holders of
(after the gradient all-reduces every holder of a block has the same gradient, so each block counts
once), which gives every rank the norm of the whole model's gradient for global-norm clipping with
no collective of its own. The learning rate is the schedule's for the step's number, so a resumed
run continues the schedule. Ranks that need data (first and last stages) read only their samples
of the step (:mod:`hetplan.runtime.data`); the others read nothing.

Tensor-parallel stages (:mod:`hetplan.runtime.parallel.tensor_parallel`, :mod:`hetplan.models.gpt_tp`): every
member runs its replica's action list on its shard of the blocks, the boundary tensors whole; its
gradient groups are per shard, and the norm counts a replicated parameter of a TP block once (shard
0's group). A stage's ``recompute`` decides what its blocks keep for backward
(:mod:`hetplan.runtime.parallel.recompute`). With the plan's ``zero: 1`` every shared gradient group is a
:class:`~hetplan.runtime.parallel.zero.Zero1Group`: its all-reduce becomes the group's reduce, its step the
holder's shard step and an all-gather of the weights.

In a co-run (the rank config's ``crossover``, :mod:`hetplan.runtime.processes.crossover`) every compute (a
forward or backward with its emulation sleep, the optimizer step) holds the device's turn, shared
with the other job's rank on the same device, and nothing else does: transfers, collectives and
pacing sleeps run without it, so the other job computes meanwhile. The wait for the turn counts as
``wait_s``. Nothing else changes, so a job computes the same numbers alone or co-run.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hetplan.contracts.emulation import SlowdownSchedule
from hetplan.contracts.rank_config import RankConfig
from hetplan.errors import HetplanError
from hetplan.models import resolve_model
from hetplan.models.base import share_tied
from hetplan.models.gpt_tp import loss_of, shard_specs
from hetplan.models.plan_tp import shard_model_block
from hetplan.runtime.comm import RankFailureError, failure_text, tag_of, wait
from hetplan.runtime.data import micro_offsets, open_samples, pipeline_offsets
from hetplan.runtime.device import make_ops
from hetplan.runtime.device.pacing import LinkPacer
from hetplan.runtime.nonfinite import nonfinite_what
from hetplan.runtime.optim import clip_coefficient
from hetplan.runtime.parallel.recompute import recomputed
from hetplan.runtime.parallel.tensor_parallel import gather_boundary, tensor_parallel_group
from hetplan.runtime.parallel.tied import TiedParams, check_tied_plan
from hetplan.runtime.parallel.zero import Zero1Group
from hetplan.runtime.precision import TORCH_DTYPES, Precision, run_blocks
from hetplan.runtime.processes.crossover import DeviceTurn
from hetplan.runtime.sync.adasum_step import ADAPTIVE, AdasumOptStep
from hetplan.runtime.sync.central import DECENTRALISED, device_transfer_group, gradient_process_groups, mode_groups
from hetplan.runtime.sync.group_scheduler import GroupClient
from hetplan.runtime.sync.group_sync import GroupLayout, make_group_sync
from hetplan.runtime.sync.param_server import PsClient
from hetplan.runtime.sync.wave_sync import GroupAverage, WaveSync
from hetplan.runtime.weights.materialise import build_rank_blocks
from hetplan.schedule.actions import Action, Kind
from hetplan.schedule.boundary import piece, splits
from hetplan.schedule.compile import CompiledPlan, DeviceProgram

__all__ = ["RankExecutor", "StepStats"]

_TRANSFERS = (Kind.SEND_ACT, Kind.RECV_ACT, Kind.SEND_GRAD, Kind.RECV_GRAD)

#: A test hook: ``RANK:STEP`` makes that rank, if it is a last stage, multiply its loss by inf in the
#: backward of that step (the logged loss stays finite): a gradient overflow, as fp16 tests need one.
OVERFLOW_ENV = "HETPLAN_TEST_OVERFLOW"


def _forced_overflow_step(rank: int) -> int | None:
    """The step :data:`OVERFLOW_ENV` forces an overflow at on ``rank`` (None: none)."""
    value = os.environ.get(OVERFLOW_ENV, "")
    if not value:
        return None
    target, _, at = value.partition(":")
    return int(at) if int(target) == rank else None


@dataclass
class StepStats:
    iteration_s: float = 0.0
    compute_s: float = 0.0
    wait_s: float = 0.0
    comm_s: float = 0.0
    loss_sum: float = 0.0
    skipped: bool = False
    #: what was not finite this step ("nan", "inf", "-inf": the loss; "gradient": its norm without
    #: loss scaling), the same on every rank; the update was then skipped everywhere (None: finite)
    nonfinite: str | None = None
    extra: dict = field(default_factory=dict)
    #: optional run-log keys of the step (``lr``, ``grad_norm``, ``clipped``): the worker adds them to
    #: its record as they are
    log: dict[str, Any] = field(default_factory=dict)


def _io_shapes(zoo, seed: int, dtype: torch.dtype, end: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Per-sample shape and dtype of the output of each block before ``end``, as :func:`run_blocks`
    makes them (a rank reads those of its stage's last block and of the block before its first;
    the blocks after its stage are neither built nor run: a 24-layer GPT of hidden size 1024 takes
    0.43 s of CPU for all 50 blocks on meta, 0.02 s for the first three).

    On the meta device first (no memory); a model whose blocks make tensors on a fixed device cannot
    run there, so then each block is built for real, one at a time, and run on a batch of one.
    """

    def carried(t: torch.Tensor) -> torch.dtype:
        return dtype if t.is_floating_point() and dtype != torch.float32 else t.dtype

    try:
        with torch.device("meta"):
            blocks = zoo.build_blocks(0, end, seed)
            Precision.cast_model(blocks, _name_of(dtype))
            x = torch.empty((1, *zoo.sample_shape()), dtype=zoo.input_dtype())
            shapes = []
            for b in blocks:
                x = run_blocks([b], x, dtype)
                shapes.append((tuple(x.shape[1:]), carried(x)))
        return shapes
    except (RuntimeError, NotImplementedError):
        pass
    x, _ = zoo.sample_batch(1, seed=seed, step=0)
    shapes = []
    with torch.no_grad():
        for i in range(end):
            block = zoo.build_block(i, seed)
            Precision.cast_model([block], _name_of(dtype))
            x = run_blocks([block], x, dtype)
            shapes.append((tuple(x.shape[1:]), carried(x)))
    return shapes


def _name_of(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(dtype, "fp32")


class RankExecutor:
    """One device's part of a plan: its blocks, optimizer, peers, process groups and actions."""

    def __init__(
        self,
        config: RankConfig,
        compiled: CompiledPlan,
        address: str,
        rank_of: dict[str, int],
        device: torch.device,
        *,
        emulate: bool,
        blocking_allreduce: bool = False,
        central_rank: int | None = None,
    ) -> None:
        self.config = config
        # blocking_allreduce: the behaviour before the schedule contract (every all-reduce issued at
        # its AR action and waited on there), kept only so benchmarks can measure what the
        # asynchronous, hook-issued all-reduce changes
        self.blocking_allreduce = blocking_allreduce
        self.address = address
        self.rank_of = rank_of
        self.device = device
        self.ops = make_ops(device)  # events, settling, peak memory: CUDA or its CPU stand-in
        self.program = compiled.programs[address]
        self.programs = compiled.programs  # peers' shares: transfers into a TP group are split (schedule/boundary.py)
        self.actions: list[Action] = self.program.actions
        self.zoo = resolve_model(config.model)
        self.names = self.zoo.block_names()
        self.first = self.program.start == 0
        self.last = self.program.end == config.n_blocks
        # only the ranks that use samples open the source (a middle stage reads nothing)
        self.samples = (
            open_samples(
                config.model,
                self.zoo,
                global_batch=config.global_batch,
                seed=config.seed,
                data=config.data,
                dataset=config.dataset,
                dataset_kwargs=config.dataset_kwargs,
            )
            if self.first or self.last
            else None
        )
        # tensor parallelism: one process group per TP replica, created first and in plan order on
        # every rank; a member's blocks are cut from the full deterministic blocks
        self.tp = tensor_parallel_group(config.plan, rank_of, address)
        # only this rank's blocks, seeded or loaded from --init-from (hetplan.runtime.weights)
        start, end = self.program.start, self.program.end
        full = build_rank_blocks(self.zoo, start, end, config.seed, init_from=config.init_from)
        self.block_list = [
            (shard_model_block(self.zoo, self.program.start + i, b, self.tp) if self.tp else b).to(device)
            for i, b in enumerate(full)
        ]  # the zoo GPT's Megatron blocks, or the layers a user / HF model's TP plan names
        if self.tp:  # a tied table cut in two local blocks (the GPT's tied head): one Parameter again
            share_tied(self.zoo.tied_parameters(), dict(enumerate(self.block_list, self.program.start)))
        Precision.cast_model(self.block_list, config.dtype)
        stage = config.plan.pipelines[self.program.pipeline].stages[self.program.stage]
        self.recompute = stage.recompute
        self.run_list = recomputed(self.block_list, stage.recompute)  # what F runs: blocks, or recomputed
        self.blocks = {self.program.start + i: b for i, b in enumerate(self.block_list)}
        params = TiedParams.unique([p for b in self.block_list for p in b.parameters()])  # tied: once
        self.compute_dtype = TORCH_DTYPES[config.dtype]
        shapes = _io_shapes(self.zoo, config.seed, self.compute_dtype, self.program.end)
        start = self.program.start
        if start == 0:
            in_dtype = self.zoo.input_dtype()
            if in_dtype.is_floating_point and config.dtype in ("fp16", "bf16"):
                in_dtype = self.compute_dtype
            self.in_shape, self.in_dtype = self.zoo.sample_shape(), in_dtype
        else:
            self.in_shape, self.in_dtype = shapes[start - 1]
            if not self.in_dtype.is_floating_point:  # a gradient travels back over every cut
                raise HetplanError(
                    f"block {self.names[start]} takes {self.in_dtype} values, so no stage can start there "
                    "(no gradient flows back through them); cut the model elsewhere",
                    field="pipelines[].stages[].blocks",
                )
        self.out_shape, self.out_dtype = shapes[self.program.end - 1]
        pipe = config.plan.pipelines[self.program.pipeline]
        self.pipe_offset = pipeline_offsets(config.plan)[self.program.pipeline]
        self.micro_offsets = micro_offsets(pipe.micro_batches)
        entry = config.devices[address]
        # emulation: the device's slowdown, which may change from a step on (a straggler)
        self.slowdown_schedule = SlowdownSchedule(entry.emulated_slowdown, entry.slowdown_changes) if emulate else None
        self.slowdown = entry.emulated_slowdown if emulate else 1.0
        self.pacer = LinkPacer(config, address, enabled=emulate)  # emulated slow links
        # a co-run (hetplan.runtime.processes.crossover): the device's turn, held while computing; None alone
        self.turn = DeviceTurn(config.crossover, address) if config.crossover is not None else None
        self.last_backward = max((i for i, a in enumerate(self.actions) if a.kind is Kind.BACKWARD), default=-1)
        # one process group per gradient group held by more than one device, created in the same
        # order on every rank (torch.distributed requires every rank to call new_group identically)
        self.groups: dict[int, tuple[dist.ProcessGroup | None, list[torch.nn.Parameter]]] = {}
        created = gradient_process_groups(compiled, rank_of)
        # tied parameters (an LM head tied to the embedding): summed over their holders, not per block
        check_tied_plan(self.zoo, config.plan)
        self.tied = TiedParams.create(self.zoo, compiled, rank_of, address, self.blocks)
        for g in compiled.groups:
            if g.id in created and address in g.devices:
                held = [p for b in g.blocks if b in self.blocks for p in self.blocks[b].parameters()]
                held = [p for p in held if not self.tied.owns(p)]  # summed over their holders instead
                self.groups[g.id] = (created[g.id], held)
        self.group_order = sorted(self.groups)
        # how a group's holders combine their gradients: the plan's sync mode (all-reduce, top-k, Adasum)
        plan = config.plan
        address_of = {r: a for a, r in rank_of.items()}
        layouts = {
            g.id: GroupLayout(
                pipeline_of_rank=tuple(
                    config.devices[address_of[r]].pipeline for r in sorted(rank_of[a] for a in g.devices)
                ),
                batches={i: p.batch for i, p in enumerate(plan.pipelines)},
                sizes=tuple(p.numel() for p in self.groups[g.id][1]),
            )
            for g in compiled.groups
            if g.id in self.groups
        }
        # (wsp has no groups; sdpipe's are inside a pipeline, summed by an all-reduce)
        combine = plan.sync if plan.sync in ("topk", "adasum") else "allreduce"
        self.group_sync = make_group_sync(
            combine,
            ratio=float(plan.sync_option("ratio")) if combine == "topk" else 1.0,
            layouts=layouts,
            deltas=combine == "adasum" and config.optimizer in ADAPTIVE,  # Adasum of the parameter changes
        )
        # ZeRO-1 (plan zero: 1): each shared group's optimizer state and fp32 master sharded over its
        # holders (hetplan.runtime.parallel.zero), made once every process group exists, in group order (each
        # checks its layout with one collective); Precision keeps the rest
        self.zero: dict[int, Zero1Group] = {}
        if config.plan.zero == 1:
            for g in compiled.groups:
                if g.id not in self.groups:
                    continue
                named = [
                    (f"{self.names[b]}/{pname}", p)
                    for b in g.blocks
                    if b in self.blocks
                    for pname, p in self.blocks[b].named_parameters()
                ]
                pg = self.groups[g.id][0]
                self.zero[g.id] = Zero1Group(
                    named, group=pg, optimizer=config.optimizer, lr=config.lr, weight_decay=config.weight_decay
                )
        self.zero_of = {id(p): z for z in self.zero.values() for p in z.params}
        self.precision = Precision(
            config.dtype,
            [p for p in params if id(p) not in self.zero_of],
            optimizer=config.optimizer,
            lr=config.lr,
            weight_decay=config.weight_decay,
        )
        self.lr_schedule = config.lr_by_step()
        self.optimizer = self.precision.optimizer
        # the decentralised sync modes (wsp, sdpipe): the pipeline's own group (loss and norm), and
        # this device's side of the central role (hetplan.runtime.sync.central)
        self.params = params
        self.pipe_group = mode_groups(config.plan, compiled, rank_of).get(self.program.pipeline)
        # wsp, sdpipe under NCCL: the pipelines' CUDA transfers on a group without the central rank
        self.transfer_group = device_transfer_group(rank_of) if config.plan.sync in DECENTRALISED else None
        self.wave_sync: WaveSync | None = None
        self.group_average: GroupAverage | None = None
        plan = config.plan
        if plan.sync in DECENTRALISED:
            if central_rank is None:
                raise HetplanError(f"sync {plan.sync} needs the central process, and none joined", field="sync")
            if plan.sync == "wsp":
                numel = sum(p.numel() for p in params)
                client = PsClient(central_rank, numel, rank=rank_of[address])
                self.wave_sync = WaveSync(
                    client, wave=int(plan.sync_option("wave")), staleness=int(plan.sync_option("staleness"))
                )
                # every device starts from the server's version 0 (a CPU tensor, like every exchange
                # with the central process: over gloo under the cpu:gloo,cuda:nccl backend map)
                self._load_flat(self.wave_sync.start().to(device))
            else:
                mine = compiled.programs[address]
                peers = {
                    q.pipeline: rank_of[a]
                    for a, q in compiled.programs.items()
                    if (q.stage, q.replica, q.tp_rank) == (mine.stage, mine.replica, mine.tp_rank)
                }
                client = GroupClient(
                    central_rank, pipeline=mine.pipeline, rank=rank_of[address], n_pipelines=len(plan.pipelines)
                )
                batches = {i: p.batch for i, p in enumerate(plan.pipelines)}
                addresses = {
                    q.pipeline: a
                    for a, q in compiled.programs.items()
                    if (q.stage, q.replica, q.tp_rank) == (mine.stage, mine.replica, mine.tp_rank)
                }
                self.group_average = GroupAverage(
                    client,
                    mine.pipeline,
                    peers,
                    batches,
                    timeout_s=config.timeout_s,
                    pacer=self.pacer if self.pacer.enabled else None,
                    addresses=addresses,
                )
        # per ZeRO group of a tensor-parallel block with tp_rank > 0: the slices of its shard that are
        # sharded parameters (the replicated ones are counted by shard 0's group, once)
        self._zero_counted: dict[int, list[tuple[int, int]] | None] = {}
        for g in compiled.groups:
            if g.id in self.zero:
                z = self.zero[g.id]
                sharded = {f"{self.names[b]}/{n}" for b in g.blocks for n in shard_specs(self.blocks[b])}
                spans = [(o, o + n) for name, o, n in zip(z.names, z.offsets, z.sizes, strict=True) if name in sharded]
                self._zero_counted[g.id] = None if g.tp_rank == 0 else spans
        # the parameters whose gradients this rank counts in the global norm: those of the blocks it
        # is the lowest rank of the holders of (every holder has the same gradient after the all-reduce)
        # ... and of a tensor-parallel block, shard k's own parameters by the lowest rank of group k,
        # its replicated ones (LayerNorm, row-parallel bias: the same on every member) by shard 0's
        counted_params: list[torch.nn.Parameter] = []
        for g in compiled.groups:
            if min(g.devices, key=rank_of.__getitem__) != address or g.id in self.zero:
                continue  # a ZeRO group's holders each count their own shard
            for b in g.blocks:
                specs = shard_specs(self.blocks[b])
                for name, p in self.blocks[b].named_parameters():
                    if g.tp_rank == 0 or name in specs:
                        counted_params.append(p)
        order = {id(p): i for i, p in enumerate(params)}
        self.norm_params = sorted(self.tied.counted(counted_params), key=lambda p: order[id(p)])
        self.group_of = {id(p): gid for gid, (_, held) in self.groups.items() for p in held}
        self._ready: dict[int, int] = {}
        self._issued: dict[int, tuple[Any, torch.Tensor | None, list[torch.Tensor]]] = {}  # pending, flat, grads
        self._issued_at: dict[int, float] = {}
        self._group_devices = {g.id: list(g.devices) for g in compiled.groups}
        self._done: set[int] = set()
        self._hook_comm_cpu = 0.0  # CPU seconds the hooks spent issuing all-reduces during a compute
        self._final_backward = False
        # topk, adasum under fp16: a rank's non-finite gradient is kept out of what it sends (and counted)
        self._sent_nonfinite = 0
        self._unscale_sent = plan.sync in ("topk", "adasum") and self.precision.scaler.enabled
        self._forced_overflow = _forced_overflow_step(rank_of[address])
        # adasum with momentum/adam/adamw: its own OPT (hetplan.runtime.sync.adasum_step); None otherwise
        self.adasum_step = AdasumOptStep.create(self, rank_of)
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)

    def held_tensors(self) -> list[torch.Tensor]:
        """Tensors this rank keeps across steps: weights, buffers, gradients, master copy, state."""
        buffers = [t for b in self.block_list for t in b.buffers()]
        zero = [t for z in self.zero.values() for t in z.state_tensors()]
        zero_weights = [p for z in self.zero.values() for p in z.params]
        # what a sync mode keeps from step to step: top-k's residuals, a WSP wave's sum and own updates
        kept = [*getattr(self.group_sync, "state_tensors", list)()]
        kept += self.wave_sync.state_tensors() if self.wave_sync is not None else []
        return [*self.precision.state_tensors(), *zero_weights, *zero, *buffers, *kept]

    # -- gradient hooks: mixed-precision accumulation and bucketed, asynchronous all-reduces ------------
    def _on_grad(self, p: torch.nn.Parameter) -> None:
        zero = self.zero_of.get(id(p))
        if zero is not None:
            zero.accumulate_one(p)
        else:
            self.precision.accumulate_one(p)
        if not self._final_backward or self.blocking_allreduce:
            return
        gid = self.group_of.get(id(p))
        if gid is None:
            return
        self._ready[gid] = self._ready.get(gid, 0) + 1
        cpu = time.thread_time()
        self._issue_ready()
        self._hook_comm_cpu += time.thread_time() - cpu  # communication, not compute: not emulated

    def _issue_ready(self, *, upto: int | None = None) -> None:
        """Issue, in group order, every group whose gradients are all final; with ``upto``, every
        group up to and including that one whether final or not (and with -1, every group)."""
        for gid in self.group_order:
            if gid in self._issued or gid in self._done:
                continue
            pg, held = self.groups[gid]
            forced = upto is not None and (upto < 0 or gid <= upto)
            if not forced and self._ready.get(gid, 0) < len(held):
                return  # later groups wait: every rank issues its collectives in the same order
            if gid in self.zero:  # ZeRO-1: the group's reduce (its own buffer; nothing to copy back)
                self._issued[gid] = (self.zero[gid].start_reduce(), None, [])
                self._issued_at[gid] = time.perf_counter()
                continue
            grads = []
            for p in held:
                g = self.precision.grad_of(p)
                if g is None:  # a parameter the loss does not reach
                    g = p.grad = torch.zeros_like(p)
                grads.append(g)
            flat = torch.cat([g.reshape(-1) for g in grads]) if grads else torch.zeros(1, device=self.device)
            flat = self._outgoing(flat)
            pending = self.group_sync.issue(gid, flat, pg, timeout_s=self.config.timeout_s)
            self._issued[gid] = (pending, flat, grads)
            self._issued_at[gid] = time.perf_counter()

    def _outgoing(self, flat: torch.Tensor) -> torch.Tensor:
        """What a group's combine sends (topk, adasum under fp16): unscaled, so that a residual or an
        Adasum ratio never mixes loss scales, and finite: a non-finite value is sent as 0 and counted
        (the step's job-wide count then skips the step on every rank). Else ``flat`` as it is."""
        if not self._unscale_sent:
            return flat
        bad = ~torch.isfinite(flat)
        if bool(bad.any()):
            self._sent_nonfinite = 1
            flat = flat.masked_fill(bad, 0.0)
        return flat.mul_(1.0 / self.precision.scaler.scale)  # a power of two: exact

    def _complete(self, gid: int, where) -> None:
        """Wait for one group's all-reduce and put the summed gradients back in place."""
        work, flat, grads = self._issued.pop(gid)
        if flat is None:  # a ZeRO-1 group: its works, in order
            for w in work:
                wait(w, timeout_s=self.config.timeout_s, what=where(f"AR{gid}"))
            # an emulated slow link: the reduce lasts the simulator's reduce-scatter (half a ring)
            self.pacer.pad(self._issued_at.pop(gid), self._zero_floor(gid, "reducescatter"))
            self._done.add(gid)
            return
        work.what = where(f"AR{gid}")
        flat = self.group_sync.complete(work)  # the combined gradient (the sum, for an all-reduce)
        if self._unscale_sent:  # back to the loss scale every other gradient of the rank carries
            flat = flat.mul_(self.precision.scaler.scale)  # the group's own buffer: no second copy
        if self.pacer.enabled:  # an emulated slow link: the collective lasts what its bytes need
            devices = self._group_devices[gid]
            kind, nbytes = self.group_sync.wire(flat, len(devices))
            self.pacer.pad(self._issued_at.pop(gid), self.pacer.collective_floor(devices, nbytes, kind))
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n
        self._done.add(gid)

    def _finish_allreduces(self, stats: StepStats, where) -> None:
        """At the step: every group issued (those the hooks have not) and waited on, in group order."""
        t0 = time.perf_counter()
        self._issue_ready(upto=-1)
        for gid in self.group_order:
            if gid not in self._done:
                self._complete(gid, where)
        self._ready.clear()
        self._done.clear()
        stats.comm_s += time.perf_counter() - t0

    # -- one step ------------------------------------------------------------------------------------
    def _samples(self, micro: int) -> tuple[int, int]:
        """Global-batch indices ``[lo, hi)`` this device computes of micro-batch ``micro``."""
        base = self.pipe_offset + self.micro_offsets[micro] + self.program.offsets[micro]
        return base, base + self.program.counts[micro]

    def _compute(self, fn, stats: StepStats) -> None:
        turn = self.turn
        if turn is not None:  # a co-run: take the device (the wait is waiting, not compute)
            stats.wait_s += turn.acquire()
        try:
            mark, cpu_start = self.ops.mark(), time.thread_time()
            self._hook_comm_cpu = 0.0
            fn()
            # the compute stream's own time (a CUDA event, waited on alone): never a device-wide
            # synchronize, which would also wait for the all-reduces the hooks issued (NCCL's streams)
            elapsed = self.ops.since(mark)
            if self.slowdown > 1.0:
                # emulate a slower device type (labelled as emulation everywhere): the compute lasts
                # slowdown x the CPU time it used. Not x the wall time: on a shared machine the wall
                # time includes waiting for a core, and multiplying that would make the emulated
                # device's speed depend on what the other ranks happen to do at the same moment.
                # (The sleep stands for compute: a co-run holds the device's turn through it.)
                target = (time.thread_time() - cpu_start - self._hook_comm_cpu) * self.slowdown + self._hook_comm_cpu
                if target > elapsed:
                    time.sleep(target - elapsed)
                    elapsed = target
        finally:
            if turn is not None:  # the other job's rank, if it is waiting, computes next
                turn.release()
        stats.compute_s += elapsed

    def _holding_turn(self, fn, stats: StepStats):
        """``fn()`` with the device's turn held (a co-run: the optimizer step is compute too)."""
        turn = self.turn
        if turn is None:
            return fn()
        stats.wait_s += turn.acquire()
        try:
            out = fn()
            self.ops.settle()  # the step's kernels done before the other job's rank takes the device
            return out
        finally:
            turn.release()

    def run_step(self, step: int) -> StepStats:
        cfg = self.config
        if self.slowdown_schedule is not None:
            self.slowdown = self.slowdown_schedule.at(step)
        stats = StepStats()
        paced_before = self.pacer.slept_s
        begin = time.perf_counter()
        rows = self.samples.step(step) if self.samples is not None else None  # this step's samples
        x_in: dict[int, torch.Tensor] = {}  # received activations (the stage's inputs), until their backward
        y_out: dict[int, torch.Tensor] = {}  # outputs, until the backward through them
        grad_out: dict[int, torch.Tensor] = {}  # gradients received for the outputs, until used
        losses: dict[int, torch.Tensor] = {}
        in_flight_sends: list[tuple[dist.Work, str, list[torch.Tensor]]] = []
        timeout = cfg.timeout_s
        precision = self.precision
        rank = dist.get_rank()

        def where(a: Action | str) -> str:
            return f"rank {rank} ({self.address}) step {step}: waiting on {a}"

        actions = self.actions
        i = 0
        while i < len(actions):
            a = actions[i]
            kind = a.kind
            if kind in _TRANSFERS:
                end = i
                while end < len(actions) and actions[end].kind in _TRANSFERS:
                    end += 1
                self._post_batch(actions[i:end], x_in, y_out, grad_out, in_flight_sends, stats, where)
                i = end
                continue
            if kind is Kind.FORWARD:
                micro = a.micro
                inputs, targets = rows.rows(*self._samples(micro)) if rows is not None else (None, None)
                if not self.first and splits(self.program):  # the TP group's chunks, gathered
                    self._gather_boundary(x_in[micro], stats, where)
                x = inputs.to(self.device) if self.first else x_in[micro].requires_grad_(True)
                target = targets.to(self.device) if self.last else None

                def forward(x=x, micro=micro, target=target) -> None:
                    with precision.autocast(self.device):
                        y = run_blocks(self.run_list, x, self.compute_dtype)
                        y_out[micro] = y
                        if self.last:
                            # a vocabulary-parallel head's loss is over its group (models/gpt_tp.py)
                            loss_fn = loss_of(self.zoo.loss, self.block_list[-1])
                            losses[micro] = loss_fn(y.float(), target) / cfg.global_batch

                self._compute(forward, stats)
            elif kind is Kind.BACKWARD:
                micro = a.micro
                if not self.last and splits(self.program):  # the TP group's gradient chunks, gathered
                    self._gather_boundary(grad_out[micro], stats, where)
                self._final_backward = i == self.last_backward

                def backward(micro=micro) -> None:
                    if self.last:
                        loss = precision.scale(losses[micro])
                        if self._forced_overflow == step:  # the test hook (OVERFLOW_ENV)
                            loss = loss * float("inf")
                        loss.backward()
                    else:
                        y_out[micro].backward(grad_out.pop(micro))
                    y_out.pop(micro)  # its consumer (this backward) has run

                self._compute(backward, stats)
                self._final_backward = False
                if self.last:
                    stats.loss_sum += float(losses.pop(micro).detach()) * cfg.global_batch
                # a received input stays until its gradient is posted back (_post_batch drops it)
            elif kind is Kind.ALLREDUCE:
                if self.blocking_allreduce:  # issue this group now and wait for it here
                    t0 = time.perf_counter()
                    self._issue_ready(upto=a.group)
                    self._complete(a.group, where)
                    stats.comm_s += time.perf_counter() - t0
                else:
                    self._issue_ready()  # issued by the hooks already, as a rule
            elif kind is Kind.STEP:
                t0 = time.perf_counter()
                for work, what, _ in in_flight_sends:
                    wait(work, timeout_s=timeout, what=what)
                in_flight_sends.clear()
                stats.comm_s += time.perf_counter() - t0
                if self.groups:
                    self._finish_allreduces(stats, where)
                t0 = time.perf_counter()
                self.tied.all_reduce(
                    precision.grad_of, device=self.device, timeout_s=timeout, what=where("the tied all-reduce")
                )
                stats.comm_s += time.perf_counter() - t0
                self._step(step, stats, where)
            i += 1
        stats.extra["loss_scale"] = precision.scaler.scale
        if self.turn is not None:
            self.turn.flush()
        if self.pacer.enabled:
            stats.extra["emulated_link_s"] = self.pacer.slept_s - paced_before
        stats.iteration_s = time.perf_counter() - begin
        return stats

    def _load_flat(self, flat: torch.Tensor) -> None:
        """Set this device's weights (and fp32 master copies) from one flat fp32 buffer, in the
        order of its parameters (:func:`hetplan.runtime.sync.central.param_names`)."""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                part = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
                if self.precision.holds(p) and self.precision.mixed:
                    self.precision.master_of(p).copy_(part)
                p.copy_(part)

    def _flat_weights(self) -> torch.Tensor:
        """This device's weights, fp32 master copies where there are, as one flat fp32 buffer."""
        held = [self.precision.master_of(p) if self.precision.mixed else p for p in self.params]
        return torch.cat([t.detach().float().reshape(-1) for t in held])

    def _decentralised_step(self, step: int, stats: StepStats, where) -> None:
        """``OPT`` of wsp and sdpipe: the loss, the overflow count and the norm inside the pipeline
        only (no job-wide collective), then a local update and the wave's push and pull (wsp) or a
        local step and the round's group average (sdpipe).

        Under fp16 every device of the pipeline learns whether any of its gradients overflowed (their
        updates depend on one backward); an overflowed step updates nothing there and backs the
        scaler off. What leaves the device is unscaled (the wave's gradient; sdpipe's weights)."""
        cfg = self.config
        precision = self.precision
        pipe = cfg.plan.pipelines[self.program.pipeline]
        scale = precision.scaler.scale  # the scale this step's gradients carry (fp16), before any update
        sq = precision.grad_sq_sum(self.norm_params).to(self.device)
        head = [stats.loss_sum, float(precision.nonfinite())]
        total = torch.cat([torch.tensor(head, dtype=torch.float64, device=self.device), sq.reshape(1)])
        if self.pipe_group is not None:
            wait(
                dist.all_reduce(total, group=self.pipe_group, async_op=True),
                timeout_s=cfg.timeout_s,
                what=where("the pipeline's loss all-reduce"),
            )
        stats.loss_sum = float(total[0]) / pipe.batch  # this pipeline's mean loss
        if not math.isfinite(stats.loss_sum):  # the pipelines step apart: none can skip with the others
            raise RankFailureError(
                f"rank {dist.get_rank()} ({self.address}) step {step}: the loss is {stats.loss_sum} (not finite); "
                f"sync {cfg.plan.sync} cannot skip a step on every pipeline together, so the run stops"
            )
        overflow = int(total[1])
        # the gradients are weighted by samples / global batch: x B / b is the pipeline's mean gradient
        to_mean = cfg.global_batch / pipe.batch
        norm = math.sqrt(float(total[2])) * to_mean / scale
        # the pipeline's own loss: the merged run log weighs every pipeline's by its samples into the
        # global batch's (contracts.runlog.global_batch_losses), as no rank here waits for the others
        mine = {"pipeline_loss": stats.loss_sum, "pipeline_batch": pipe.batch}
        if self.wave_sync is not None:
            self._wave_step(step, stats, overflow=overflow, scale=scale)
            stats.log.update(mine)
            return
        assert self.group_average is not None
        coef = (clip_coefficient(norm, cfg.clip_grad_norm) if overflow == 0 else 1.0) * to_mean
        lr = self.lr_schedule.lr_at(step)
        precision.set_lr(lr)
        stats.skipped = not self._holding_turn(
            lambda: precision.step(nonfinite_anywhere=overflow, clip_coef=coef), stats
        )
        self._load_flat(self.group_average.after_step(step, self._flat_weights()))
        stats.log = {
            "lr": lr,
            "grad_norm": norm if math.isfinite(norm) else None,
            "group": list(self.group_average.log[-1]),
            **mine,
        }

    def _wave_step(self, step: int, stats: StepStats, *, overflow: int, scale: float) -> None:
        """wsp's ``OPT``: the local update and, at a wave's end, the push and pull (the server steps).

        The local update is SGD on this device's mean gradient (its samples' share of the global
        batch: ``B / n`` x the gradient as weighted for the all-reduce)."""
        assert self.wave_sync is not None
        cfg = self.config
        precision = self.precision
        flat = None
        if overflow == 0:
            flat = torch.cat([(g if g is not None else torch.zeros_like(p)).float().reshape(-1)
                              for g, p in ((precision.grad_of(p), p) for p in self.params)])  # fmt: skip
            if precision.scaler.enabled:
                flat.mul_(1.0 / scale)  # unscaled before it leaves the device (a power of two: exact)
        precision.zero_grad()  # the gradient is in ``flat`` now: fp32 ones are freed before the exchange
        samples = sum(self.program.counts)  # this device's samples per step
        exchanging = time.perf_counter()
        out = self.wave_sync.after_step(  # both flat buffers handed over: updated and kept in place
            step,
            self._flat_weights(),
            flat,
            lr=self.lr_schedule.lr_at(step),
            to_mean=cfg.global_batch / max(1, samples),
            donate=True,
        )
        if out.pulled:
            # an emulated slow path to the server: the wave's push and pull last what the
            # simulator charges (every device's bytes through the central process's link)
            floor = self.pacer.central_exchange_floor(list(self.rank_of), self.wave_sync.client.total_bytes)
            self.pacer.pad(exchanging, floor)
        self._load_flat(out.weights)
        precision.scaler.update(finite=overflow == 0)  # this pipeline's overflow: the same on its devices
        for _ in range(out.backoff):  # clocks the server skipped for other workers' overflows
            precision.scaler.update(finite=False)
        stats.skipped = overflow > 0 or out.skipped
        stats.log = {"lr": self.lr_schedule.lr_at(step // self.wave_sync.wave)}  # the server's, which clips
        if out.pulled and self.wave_sync.log:
            stats.log["wave"] = dict(self.wave_sync.log[-1])

    def close(self) -> None:
        """Tell the central role this device is done (wsp, sdpipe); let go of the device's turn file."""
        for role in (self.wave_sync, self.group_average):
            if role is not None:
                role.stop()
        if self.turn is not None:
            self.turn.close()

    def _step(self, step: int, stats: StepStats, where) -> None:
        """``OPT``: one all-reduce of [loss, overflow count, squared gradient norm] over the job (on the
        rank's device), then clip by the global norm, set the step's learning rate and step."""
        if self.adasum_step is not None:  # each pipeline steps, then the Adasum of the changes
            self.adasum_step.run(self, step, stats, where)
            return
        if self.config.plan.sync in DECENTRALISED:
            self._decentralised_step(step, stats, where)
            return
        cfg = self.config
        precision = self.precision
        scale = precision.scaler.scale  # the scale this step's gradients carry (fp16), before any update
        # every member of a tensor-parallel last stage computes the same loss: shard 0 reports it
        loss = stats.loss_sum if self.tp is None or self.tp.rank == 0 else 0.0
        nonfinite = precision.nonfinite() + self._sent_nonfinite
        self._sent_nonfinite = 0
        sq = precision.grad_sq_sum(self.norm_params).to(self.device)
        for gid, z in self.zero.items():  # every holder adds its shard's part
            if precision.scaler.enabled:
                nonfinite += z.shard_has_inf()
            sq = sq + self._zero_sq(gid, z)
        head = torch.tensor([loss, float(nonfinite)], dtype=torch.float64, device=self.device)
        total = torch.cat([head, sq.reshape(1)])
        wait(dist.all_reduce(total, async_op=True), timeout_s=cfg.timeout_s, what=where("the loss all-reduce"))
        stats.loss_sum = float(total[0]) / cfg.global_batch
        overflow = int(total[1])
        norm = math.sqrt(float(total[2])) / scale
        # all-reduced, so every rank sees it alike and skips the update with the others (fp16 overflows
        # of the gradient alone are the loss scaler's ordinary business, not this)
        stats.nonfinite = nonfinite_what(stats.loss_sum, norm, scaled=precision.scaler.enabled)
        overflow += stats.nonfinite is not None
        coef = clip_coefficient(norm, cfg.clip_grad_norm) if overflow == 0 else 1.0
        lr = self.lr_schedule.lr_at(step)
        precision.set_lr(lr)
        for gid in sorted(self.zero):  # ZeRO-1: step each shard, gather the weights (group order)
            z = self.zero[gid]
            if overflow:
                z.zero_grad()
                continue
            z.set_lr(lr)
            self._holding_turn(lambda z=z: z.step(clip_coef=coef, loss_scale=scale), stats)
            gathering = time.perf_counter()
            for w in z.start_gather():
                wait(w, timeout_s=cfg.timeout_s, what=where(f"the ZeRO-1 gather of group {gid}"))
            self.pacer.pad(gathering, self._zero_floor(gid, "allgather"))  # half a ring, as the simulator
            z.finish_gather()
        stats.skipped = not self._holding_turn(
            lambda: precision.step(nonfinite_anywhere=overflow, clip_coef=coef), stats
        )
        if hasattr(self.group_sync, "step_done"):  # top-k: a step skipped everywhere gives its residuals back
            self.group_sync.step_done(skipped=stats.skipped)
        stats.log = {"lr": lr, "grad_norm": norm if math.isfinite(norm) else None}
        if cfg.clip_grad_norm is not None:
            stats.log["clipped"] = coef < 1.0

    def _zero_floor(self, gid: int, kind: str) -> float:
        """The least time of a ZeRO-1 group's reduce-scatter or all-gather on emulated links: half a
        ring all-reduce of the group's gradient bytes (4 a parameter: the fp32 buffer the group
        reduces), as ``CostModel.reduce_scatter`` / ``all_gather``; 0 without emulated links."""
        if not self.pacer.enabled:
            return 0.0
        nbytes = 4.0 * sum(self.zero[gid].sizes)
        return self.pacer.collective_floor(self._group_devices[gid], nbytes, kind)

    def _zero_sq(self, gid: int, z: Zero1Group) -> torch.Tensor:
        """This holder's part of the squared global norm from ZeRO group ``gid``: its shard, or for a
        tensor-parallel shard group other than shard 0's, the sharded parameters' part of it."""
        spans = self._zero_counted.get(gid)
        if spans is None:
            return z.shard_sq_norm()
        grad = z.shard_grad
        total = torch.zeros((), dtype=torch.float64, device=grad.device)
        for lo, hi in spans:
            a, b = max(lo, z.start), min(hi, z.end)
            if b > a:
                total = (
                    total + torch.linalg.vector_norm(grad[a - z.start : b - z.start], 2, dtype=torch.float64).square()
                )
        return total

    def _gather_boundary(self, buffer: torch.Tensor, stats: StepStats, where) -> None:
        """All-gather a split boundary buffer inside the TP group (schedule/boundary.py)."""
        t0 = time.perf_counter()
        try:
            gather_boundary(buffer, self.tp)
        except RuntimeError as exc:
            raise RankFailureError(f"{where('the boundary all-gather')}: {failure_text(exc)}") from None
        stats.comm_s += time.perf_counter() - t0

    def _post_batch(self, batch, x_in, y_out, grad_out, in_flight_sends, stats: StepStats, where) -> None:
        """Post one batch of transfers together; wait for it if it receives anything."""
        ops: list[dist.P2POp] = []
        keep: list[torch.Tensor] = []
        received: list[tuple[str, int]] = []  # (peer, bytes) of each receive
        receives = False
        for a in batch:
            micro = a.micro
            peer = self.rank_of[a.peer]
            lo = a.lo - self.program.offsets[micro]
            n = a.hi - a.lo
            if a.kind is Kind.RECV_ACT or a.kind is Kind.RECV_GRAD:
                grad = a.kind is Kind.RECV_GRAD
                table = grad_out if grad else x_in
                if micro not in table:
                    shape, dtype = (self.out_shape, self.out_dtype) if grad else (self.in_shape, self.in_dtype)
                    count = self.program.counts[micro]
                    table[micro] = torch.empty((count, *shape), dtype=dtype, device=self.device)
                target = _split_part(table[micro], a, self.program, self.program)
                target = table[micro][lo : lo + n] if target is None else target
                if target.numel() == 0:  # a split transfer with no part in this member's chunk
                    continue
                ops.append(dist.P2POp(dist.irecv, target, peer, group=self.transfer_group, tag=tag_of(micro, grad)))
                received.append((a.peer, target.numel() * target.element_size()))
                receives = True
            else:
                grad = a.kind is Kind.SEND_GRAD
                source = x_in[micro].grad if grad else y_out[micro]
                piece = _split_part(source.detach(), a, self.program, self.programs[a.peer])
                piece = source[lo : lo + n].detach() if piece is None else piece
                if piece.numel() == 0:
                    continue
                if not piece.is_contiguous():
                    piece = piece.contiguous()
                keep.append(piece)
                ops.append(dist.P2POp(dist.isend, piece, peer, group=self.transfer_group, tag=tag_of(micro, grad)))
        # a received activation's gradient has been handed to the batch: the input itself is done
        for a in batch:
            if a.kind is Kind.SEND_GRAD:
                x_in.pop(a.micro, None)
        what = where(" ".join(str(a) for a in batch))
        if not ops:  # every transfer of the batch was a split piece of nothing (batch_isend_irecv refuses [])
            return
        posted = time.perf_counter()
        try:
            works = dist.batch_isend_irecv(ops)
        except RuntimeError as exc:  # posting to a peer whose connection has closed fails at once
            raise RankFailureError(f"{what}: {failure_text(exc)}") from None
        if receives:
            for work in works:
                wait(work, timeout_s=self.config.timeout_s, what=what)
            # an emulated slow link: the batch's receives last at least what their bytes need on it
            self.pacer.pad(posted, self.pacer.p2p_floor(received))
            stats.wait_s += time.perf_counter() - posted
        else:
            in_flight_sends.extend((work, what, keep) for work in works)
        # sends that have completed no longer need their tensors (a failed one says so when waited on)
        try:
            in_flight_sends[:] = [s for s in in_flight_sends if not s[0].is_completed()]
        except RuntimeError as exc:
            raise RankFailureError(f"{what}: {failure_text(exc)}") from None


def _split_part(buffer: torch.Tensor, a: Action, owner: DeviceProgram, receiver: DeviceProgram) -> torch.Tensor | None:
    """The flat part of ``owner``'s boundary ``buffer`` that transfer ``a`` carries where transfers
    into ``receiver`` are split (:func:`hetplan.schedule.boundary.piece`; may be empty), else None."""
    if not splits(receiver):
        return None
    row = math.prod(buffer.shape[1:])
    base = owner.offsets[a.micro] * row
    lo, hi = piece(a.lo, a.hi, row, receiver, a.micro)
    flat = buffer.reshape(-1)
    return flat[lo - base : max(lo, hi) - base]

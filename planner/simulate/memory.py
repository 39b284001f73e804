"""Memory per device: every tensor the runtime holds, walked along the device's action list.

    use = device_memory(program, profile, optimizer="adam", device_type=a100, reduced_blocks={0, 1})
    use.tensor_bytes    # the peak of live tensors (what torch.cuda.max_memory_allocated measures)
    use.total           # tensors x (1 + fragmentation) + the type's reserve: what must fit
    use.fits

What the runtime (:mod:`hetplan.runtime.executor`) holds, and so what is counted here:

* **static**: the weights at the plan's dtype; the gradients (fp32 plans: ``.grad`` at fp32; fp16 and
  bf16 plans: an fp32 accumulation buffer per parameter, as Megatron's ``main_grad``); the optimizer
  state (SGD none, momentum one buffer, Adam two moments, all fp32) and, for fp16/bf16, the fp32
  master copy of the weights the optimizer updates.
* **per micro-batch in flight** (from its forward to its backward): the activations its blocks save
  for backward (the profile's ``activation_bytes``, which counts a stage's input once, in its first
  block; fp16/bf16 profiles are measured under autocast, as the runtime trains, so what autocast
  keeps in fp32, the loss's log-softmax among it, is counted at fp32), the stage's output, held
  until the backward runs through it (the activation sent to the next stage, or on the last stage
  the logits).
* **during a backward**: the gradient received for the stage's output and the gradient of the
  stage's input being produced for the previous stage (boundary buffers in flight), and a workspace
  the size of the largest block's saved activations (the backward through a block materialises
  gradients about as large as what it saved). For fp16/bf16 a hook moves each half-precision
  ``.grad`` into its fp32 buffer the moment it is made, so at most one parameter's exists. fp32
  gradients are freed by each step (set to None) and come back with the next step's first
  backward, so a GPipe stage's peak at the end of its forwards has none.
* **after the last backward**: the flat all-reduce buckets of the gradient groups the device shares
  with others (fp32 for mixed precision, the gradient dtype otherwise), held until the step.
* **the sync mode's buffers** (:func:`sync_buffers`, per device's :class:`SyncRole`): what it keeps
  from step to step (top-k's residual, a WSP wave's sum and own waves), what it adds beside the
  buckets (top-k's selection, Adasum's receive buffer) and at the step (Adasum's old weights and
  delta, WSP's and SDPipe's flat copies); under ``wsp`` the optimizer state is on the server.

The walk follows the schedule as it actually runs: 1F1B stage ``s`` of ``S`` holds at most
``min(S - s, M)`` micro-batches, GPipe all ``M``. The device type's reserve (CUDA context,
workspaces, NCCL buffers) and allocator fragmentation come from the catalog
(:class:`hetplan.contracts.catalog.DeviceType`): the plan fits when ``tensors x (1 + fragmentation) +
reserve <= memory``.

Tensor parallelism, recomputation and ZeRO-1 (:func:`stage_terms` gives the per-sample terms the
walk and the search's tables share, so the two agree by construction):

* a member of a degree-``t`` group holds each block's degree-``t`` shard: its parameters (weights,
  gradients, master copy and optimizer state follow them) and activations per the profile
  (Korthikanti et al. 2022: s·h·(10 + 24/t + 5·a·s/(h·t)) per layer at 2 bytes, no sequence
  parallelism); boundary tensors stay whole (every member holds the whole stage output), except the
  logits of a vocabulary-parallel head, 1/t of them (:func:`held_output_bytes`);
* ``recompute: selective`` keeps each block's activations less its ``selective_bytes`` (the
  attention internals), and restores them for one block during its backward; ``full`` keeps only
  each block's input (one per block per in-flight micro-batch: per-block checkpointing, as
  Megatron's full/uniform recomputation of one layer at a time) and restores one block's full
  activations during its backward;
* ZeRO-1 (``zero_holders``): optimizer state and the fp32 master copy of a block are divided by the
  holders of its gradient group (Rajbhandari et al. 2020, stage 1); gradients stay whole.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace

from hetplan.contracts.catalog import DeviceType
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.schedule.actions import Kind
from hetplan.schedule.compile import CompiledPlan, DeviceProgram, with_shared_groups
from hetplan.simulate.costs import ProfileSnapshot
from hetplan.simulate.vocab import whole_vocab_profile

__all__ = [
    "ADASUM_DOT_CHUNK",
    "AVERAGE_CHUNK",
    "FP32_BYTES",
    "MIXED_PRECISION",
    "NCCL_BUFFSIZE",
    "NCCL_CHANNELS",
    "OPTIMIZER_STATE_BYTES",
    "MemoryUse",
    "StageTerms",
    "SyncBuffers",
    "SyncRole",
    "comm_buffer_bytes",
    "communicators_of",
    "device_memory",
    "held_output_bytes",
    "plan_memory",
    "stage_terms",
    "static_bytes_per_param",
    "static_stage_bytes",
    "sync_buffers",
    "sync_roles",
    "zero_checkpoint_bytes",
]

#: fp32 optimizer state per parameter: SGD none, momentum one buffer, Adam two moments.
OPTIMIZER_STATE_BYTES = {"sgd": 0.0, "momentum": 4.0, "adam": 8.0, "adamw": 8.0}
#: Size of an fp32 element: master weights, gradient accumulation buffers, optimizer state.
FP32_BYTES = 4.0
#: Dtypes the runtime trains with half-precision weights and an fp32 master copy.
MIXED_PRECISION = ("fp16", "bf16")
#: NCCL's default buffer per connection and protocol (NCCL documentation, environment variables:
#: ``NCCL_BUFFSIZE``, default 4194304 = 4 MiB).
NCCL_BUFFSIZE = 4 * 2**20
#: Channels per communicator priced: NCCL opens at least two rings (channels) per communicator, more
#: on NVLink systems (what the fitted reserve absorbs); one receive buffer per channel.
NCCL_CHANNELS = 2


def static_bytes_per_param(dtype: str, optimizer: str, param_bytes_per_param: float) -> float:
    """Bytes per parameter that live for the whole run: weights, gradients, master copy, state."""
    state = OPTIMIZER_STATE_BYTES[optimizer]
    if dtype in MIXED_PRECISION:
        return param_bytes_per_param + FP32_BYTES + FP32_BYTES + state  # weights, fp32 grads, master
    return 2.0 * param_bytes_per_param + state


@dataclass(frozen=True)
class MemoryUse:
    """Bytes on one device at its peak; ``activations`` is everything above the static part."""

    weights: float
    gradients: float
    optimizer: float  # optimizer state and, for fp16/bf16, the fp32 master weights
    # the peak of everything above weights, gradients and optimizer state (activations, boundary
    # buffers, backward workspace, all-reduce buckets); in fp32 gradients exist only from a step's
    # first backward on, so where the peak comes before it (GPipe) this is the peak less them
    activations: float
    reserve: float
    capacity: float
    peak_micro_batches: int  # micro-batches whose activations are held at the peak
    fragmentation: float = 0.0
    # a checkpoint save's transient beyond weights, gradients and optimizer state (activations are
    # gone by then): ZeRO-1 holders gather their groups' full state (zero_checkpoint_bytes)
    checkpoint: float = 0.0
    # communication buffers of the communicators the device is a member of (NCCL; comm_buffer_bytes)
    comm_buffers: float = 0.0
    # what the sync mode keeps from step to step (top-k's error-feedback residual; sync_buffers)
    sync_state: float = 0.0

    @property
    def tensor_bytes(self) -> float:
        """Live tensors at the peak of a training step (what an allocator-level measurement sees)."""
        return self.weights + self.gradients + self.optimizer + self.sync_state + self.activations

    @property
    def save_bytes(self) -> float:
        """Live tensors at the peak of a checkpoint save (after a step)."""
        return self.weights + self.gradients + self.optimizer + self.sync_state + self.checkpoint

    @property
    def total(self) -> float:
        """What a training step needs: its tensors, allocator fragmentation, the type's reserve and
        the communicators' buffers. A checkpoint save's peak is not in it (:attr:`save_total`): the
        plan does not know whether or how often the run saves, and frameworks that save ZeRO state
        shard-wise never hold the gathered state, so counting it would refuse plans that run."""
        return self.tensor_bytes * (1.0 + self.fragmentation) + self.reserve + self.comm_buffers

    @property
    def save_total(self) -> float:
        """What a checkpoint save of this runtime needs (ZeRO-1 holders gather their groups' state)."""
        return self.save_bytes * (1.0 + self.fragmentation) + self.reserve + self.comm_buffers

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def save_fits(self) -> bool:
        """Whether a save of this runtime fits too (``launch --save`` on a plan where it does not
        runs out of memory while saving; a plan is not refused for it)."""
        return self.save_total <= self.capacity

    @property
    def headroom(self) -> float:
        return self.capacity - self.total


@dataclass(frozen=True)
class StageTerms:
    """Per-device figures of blocks ``[start, end)`` at one degree and recomputation (bytes)."""

    params: float  # parameters this device holds
    weights: float  # their bytes at the profile's dtype
    held_per_sample: float  # kept from a forward to its backward: saved activations + the output
    workspace: float  # per sample, during a backward: restored activations + gradient workspace
    grad_in: float  # per sample: the gradient received for the output (0 on the last stage)
    grad_out: float  # per sample: the gradient sent back for the input (0 on the first stage)


def held_output_bytes(profile: ModelProfile, end: int, tp: int = 1) -> float:
    """Per sample, the output a member of a degree-``tp`` stage ending at block ``end`` holds until
    its backward: the block's output, except a sharded LM head (kind ``head`` at a degree whose shard
    holds fewer parameters than the block, the GPT's vocabulary-parallel head): its slice of the
    logits, 1/t of them (Megatron's vocabulary-parallel cross-entropy never gathers them)."""
    block = profile.blocks[end - 1]
    last = end == len(profile.blocks)
    # a tied head's table is a shared entry: counted with the block's own parameters
    if (
        tp > 1
        and last
        and block.kind == "head"
        and profile.block_params(end - 1, tp)[0] < profile.block_params(end - 1)[0]
    ):
        return block.output_bytes / tp
    return block.output_bytes


def backward_extra(kept: list[float], work: list[float]) -> float:
    """Per sample, what a stage's backward holds beyond everything its forward kept, at its peak.

    The backward runs the blocks last to first, and autograd frees what a block saved once its
    backward has run: while block ``k``'s runs, the blocks after it no longer hold theirs, so the
    stage holds ``kept[0..k] + work[k]``; the most over ``k``, less all of ``kept``, is the term
    (``work[-1]`` at least: the last block's backward runs with everything still held). Counting
    the largest ``work`` beside all of ``kept`` instead over-stated a 3-block stage by up to one
    block's activations (9-12% of its peak at s = 2h)."""
    running, best = 0.0, -math.inf
    for k, w in zip(kept, work, strict=True):
        running += k
        best = max(best, running + w)
    return best - running if kept else 0.0


def stage_terms(profile: ModelProfile, start: int, end: int, *, tp: int = 1, recompute: str = "none") -> StageTerms:
    """What a member of a degree-``tp`` group holding blocks ``[start, end)`` keeps, per sample."""
    shards = [profile.shard(b, tp) for b in range(start, end)]
    out_bytes = held_output_bytes(profile, end, tp)
    if recompute == "full":  # each block's input, one per block (per-block checkpoints)
        kept = [float(profile.blocks[b - 1].output_bytes if b > 0 else profile.input_bytes) for b in range(start, end)]
        work = [2.0 * sh.activation_bytes for sh in shards]  # its forward re-run, and the gradients
    elif recompute == "selective":  # the attention internals dropped, restored one block at a time
        kept = [sh.activation_bytes - sh.selective_bytes for sh in shards]
        work = [sh.activation_bytes + sh.selective_bytes for sh in shards]
    else:
        kept = [sh.activation_bytes for sh in shards]
        # the backward through a block materialises gradients about the size of what it saved
        work = [sh.activation_bytes for sh in shards]
    saved = sum(kept)
    workspace = backward_extra(kept, work)
    shared_params, shared_weights = profile.shared_held(start, end, tp)  # tied copies, once per stage
    return StageTerms(
        params=float(sum(sh.params for sh in shards)) + shared_params,
        weights=float(sum(sh.param_bytes for sh in shards)) + shared_weights,
        held_per_sample=saved + out_bytes,
        workspace=workspace,
        grad_in=0.0 if end == len(profile.blocks) else out_bytes,
        grad_out=0.0 if start == 0 else profile.blocks[start - 1].output_bytes,
    )


#: Elements per chunk of Adasum's float64 dot products and of SDPipe's float64 group average: their
#: workspace is a chunk's, not a tensor's (``hetplan.runtime.sync.adasum.DOT_CHUNK``,
#: ``hetplan.runtime.sync.wave_sync.AVERAGE_CHUNK``; tests/simulate/test_sync_memory.py checks they agree).
ADASUM_DOT_CHUNK = 1 << 16
AVERAGE_CHUNK = 1 << 16
#: The sync modes whose pipelines step their own optimizer on parameter changes under Adasum.
ADAPTIVE_OPTIMIZERS = ("momentum", "adam", "adamw")


@dataclass(frozen=True)
class SyncRole:
    """What the walk needs of a plan's sync mode for one device (:func:`sync_roles` makes them).

    ``receives``: Adasum, the device combines a partner's vector into its own (a left node of the
    pipelines' tree); ``gathers``: a replicated stage's leader, which sums its replicas' vectors
    (gradients, into the same receive buffer under SGD; first, inside its pipeline, on parameter
    changes)."""

    mode: str = "allreduce"
    optimizer: str = "sgd"
    wave: int = 1  # wsp
    staleness: int = 0  # wsp
    group: int = 1  # sdpipe: the pipelines a group averages (its group size, at most the pipelines)
    receives: bool = False
    gathers: bool = False


@dataclass(frozen=True)
class SyncBuffers:
    """A sync mode's buffers on one device, in bytes (:func:`sync_buffers`)."""

    kept: float = 0.0  # from step to step (``MemoryUse.sync_state``)
    exchange: float = 0.0  # beside the buckets after the last backward, the gradients still there
    opt_with_grads: float = 0.0  # at OPT, beyond ``kept``, while fp32 gradients are still there
    opt: float = 0.0  # at OPT, beyond ``kept``, once fp32 gradients are freed (fp16/bf16 keep theirs)


def sync_buffers(role: SyncRole | str, buckets: float, *, params: float = 0.0) -> SyncBuffers:
    """The buffers of ``role``'s sync mode on a device whose shared gradient groups flatten to
    ``buckets`` bytes (fp32 elements: ``G = buckets / 4``) and which holds ``params`` parameters
    (``P = 4 params``, its weights as one flat fp32 vector), as the runtime allocates them
    (:mod:`hetplan.runtime.sync`; docs/cost-model.md 8a gives each term's source):

    * ``allreduce``: none beyond the buckets.
    * ``topk``: the error-feedback residual, 4·G, kept (the previous one, held until the step
      commits, while a group is compressed); beside it and the bucket while a group is compressed
      (``TopK.compress``): gradient + residual (4·G, the new residual), the finite mask (G), the sort
      key (4·G) and the stable sort's values, int64 indices and int64 workspace (20·G, measured:
      ``torch.sort(stable=True)`` on CPU peaks at 5x its input): 29·G. The gathered (index, value)
      pairs, n·k·12 bytes, are left out (0.24 B per element at 1% over 2 ranks).
    * ``adasum`` on gradients (SGD): a receiving device's one receive buffer (``buckets``) and the
      float64 dot products' chunk (12 bytes an element of :data:`ADASUM_DOT_CHUNK`:
      ``adasum._dots``). On parameter changes (momentum, Adam, AdamW): a replicated stage's leader
      receives its replicas' gradients (``buckets``, ``AdasumTree.pipeline_sum``); at ``OPT`` the
      old weights are copied before the local step (``buckets``, ``AdasumDeltas.before``), and
      after it the delta (``buckets``) and, on a receiving device, the receive buffer and the
      dot chunk (``AdasumDeltas.after``).
    * ``wsp``: the flat gradient and flat weights handed to ``WaveSync.after_step`` (2·P); kept
      from step to step: the wave's sum (``wave > 1``), its local update (``wave > 1``,
      ``staleness > 0``) and up to ``D`` own waves not yet pulled back (D·P); with one-step waves
      and ``D > 0`` the wave's local update is made at ``OPT`` (P). The optimizer state is on the
      parameter server, not here (:func:`device_memory`).
    * ``sdpipe``: the device's flat weights and one received copy per partner (``group``·P), and
      the float64 average's chunk (16 bytes an element of :data:`AVERAGE_CHUNK`:
      ``GroupAverage.after_step``).
    """
    if isinstance(role, str):
        role = SyncRole(role)
    elements = buckets / FP32_BYTES
    flat = FP32_BYTES * params
    if role.mode == "topk":
        return SyncBuffers(kept=buckets, exchange=29.0 * elements)
    if role.mode == "adasum" and buckets > 0:
        combine = buckets + 12.0 * min(elements, ADASUM_DOT_CHUNK)
        if role.optimizer not in ADAPTIVE_OPTIMIZERS:  # a leader sums its replicas into the same buffer
            return SyncBuffers(exchange=combine if role.receives or role.gathers else 0.0)
        combine = combine if role.receives else 0.0
        return SyncBuffers(
            exchange=buckets if role.gathers else 0.0, opt_with_grads=buckets, opt=2.0 * buckets + combine
        )
    if role.mode == "wsp":
        kept = (flat if role.wave > 1 else 0.0) * (2.0 if role.staleness > 0 else 1.0) + role.staleness * flat
        local = flat if role.wave == 1 and role.staleness > 0 else 0.0
        return SyncBuffers(kept=kept, opt_with_grads=flat, opt=2.0 * flat + local)
    if role.mode == "sdpipe" and role.group > 1:
        return SyncBuffers(opt=role.group * flat + 16.0 * min(params, AVERAGE_CHUNK))
    return SyncBuffers()


def sync_roles(compiled: CompiledPlan, plan: Plan | None, *, optimizer: str | None = None) -> dict[str, SyncRole]:
    """Each device's :class:`SyncRole` under ``plan``'s sync mode (all-reduce without a plan), with
    ``optimizer`` (default: the plan's).

    Adasum's tree (``hetplan.runtime.sync.adasum.AdasumTree``): per gradient group, each
    pipeline's holders are led by the lowest rank (ranks follow the nodes and each node's device
    indices), and the pipelines' leaders pair up level by level in pipeline order, the left one of
    each pair receiving."""
    if plan is None:
        return {a: SyncRole() for a in compiled.programs}
    base = SyncRole(
        plan.sync,
        optimizer or plan.optimizer,
        wave=int(plan.sync_option("wave")) if plan.sync == "wsp" else 1,
        staleness=int(plan.sync_option("staleness")) if plan.sync == "wsp" else 0,
        group=min(int(plan.sync_option("group_size")), len(plan.pipelines)) if plan.sync == "sdpipe" else 1,
    )
    receives: set[str] = set()
    gathers: set[str] = set()
    if plan.sync == "adasum":
        for g in compiled.groups:
            if len(g.devices) < 2:
                continue
            members: dict[int, list[str]] = {}
            for a in g.devices:
                members.setdefault(compiled.programs[a].pipeline, []).append(a)
            leaders = {q: min(rs, key=_rank_key) for q, rs in members.items()}
            gathers.update(leaders[q] for q, rs in members.items() if len(rs) > 1)
            nodes = sorted(members)
            while len(nodes) > 1:  # the left node of each pair receives; an odd one out is carried
                receives.update(leaders[q] for q in nodes[0:-1:2])
                nodes = nodes[0::2]
    variants = {(False, False): base}  # one role object per kind of device, not one a device
    for a in compiled.programs:
        key = (a in receives, a in gathers)
        if key not in variants:
            variants[key] = replace(base, receives=key[0], gathers=key[1])
    return {a: variants[(a in receives, a in gathers)] for a in compiled.programs}


def _rank_key(address: str) -> tuple[str, int]:
    """A device's place in rank order: its node, then its index there."""
    node, _, index = address.rpartition("/")
    return node, int(index) if index.isdigit() else 0


def zero_checkpoint_bytes(params: float, *, optimizer: str, dtype: str) -> float:
    """Bytes a ZeRO-1 holder of a group of ``params`` parameters allocates while a checkpoint saves:
    :meth:`hetplan.runtime.parallel.zero.Zero1Group.state_dict` gathers each sharded fp32 tensor (each
    optimizer state buffer and, for fp16/bf16, the master weights; fp32 weights are the master and
    are not copied) and keeps a full copy of each per parameter, one flat gathered tensor alive
    beside them at a time: 4 bytes per parameter per tensor, plus 4 for the flat one."""
    tensors = OPTIMIZER_STATE_BYTES[optimizer] / FP32_BYTES + (1.0 if dtype in MIXED_PRECISION else 0.0)
    return FP32_BYTES * params * (tensors + 1.0) if tensors else 0.0


def optimizer_bytes(
    profile: ModelProfile,
    start: int,
    end: int,
    *,
    optimizer: str,
    dtype: str,
    tp: int = 1,
    holders: Mapping[int, int] | None = None,
) -> float:
    """Optimizer state and, for fp16/bf16, the fp32 master copy of blocks ``[start, end)`` on one
    device: each block's share at degree ``tp``, divided by its ZeRO-1 ``holders`` (default 1)."""
    state = OPTIMIZER_STATE_BYTES[optimizer]
    mixed = dtype in MIXED_PRECISION
    total = 0.0
    for b in range(start, end):
        shared = (holders or {}).get(b, 1)
        # the ZeRO-1 runtime steps a flat fp32 shard of the weights, a master copy under fp32 too
        # (planner/runtime/parallel/zero.py: the weights are separate tensors, the shard a flat slice of them)
        master = FP32_BYTES if mixed or shared > 1 else 0.0
        total += (state + master) * profile.shard(b, tp).params / shared
    # a tied copy is stepped by every holder in full (ZeRO-1 refuses tied parameters)
    total += (state + (FP32_BYTES if mixed else 0.0)) * profile.shared_held(start, end, tp)[0]
    return total


def device_memory(
    program: DeviceProgram,
    profile: ModelProfile,
    *,
    optimizer: str,
    device_type: DeviceType,
    reduced_blocks: Collection[int] = (),
    dtype: str | None = None,
    recompute: str = "none",
    zero_holders: Mapping[int, int] | None = None,
    communicators: int = 0,
    sync: str | SyncRole = "allreduce",
) -> MemoryUse:
    """Peak memory of one device running ``program`` (``reduced_blocks``: its blocks that are
    all-reduced with other devices, whose gradients pass through a flat bucket; ``recompute``: its
    stage's; ``zero_holders``: with ZeRO-1, block -> the devices its optimizer state is sharded over;
    ``communicators``: its communicators and point-to-point peers, :func:`communicators_of`;
    ``sync``: the plan's sync mode, or the device's :class:`SyncRole` in it, whose buffers
    :func:`sync_buffers` prices)."""
    return _device_memory(
        program,
        profile,
        optimizer=optimizer,
        device_type=device_type,
        reduced_blocks=reduced_blocks,
        dtype=dtype or profile.dtype,
        recompute=recompute,
        zero_holders=zero_holders,
        communicators=communicators,
        sync=SyncRole(sync, optimizer) if isinstance(sync, str) else sync,
        statics={},
    )


def _static_figures(
    program: DeviceProgram,
    profile: ModelProfile,
    *,
    optimizer: str,
    dtype: str,
    recompute: str,
    reduced_blocks: Collection[int],
    zero_holders: Mapping[int, int] | None,
) -> tuple[StageTerms, float, float, float, float]:
    """(per-sample terms, gradients, optimizer state, all-reduce buckets, a save's ZeRO-1 gather)
    of a device's stage."""
    mixed = dtype in MIXED_PRECISION
    tp = program.tensor_parallel
    terms = stage_terms(profile, program.start, program.end, tp=tp, recompute=recompute)
    gradients = FP32_BYTES * terms.params if mixed else terms.weights
    optimizer_total = optimizer_bytes(
        profile, program.start, program.end, optimizer=optimizer, dtype=dtype, tp=tp, holders=zero_holders
    )
    reduced = [b for b in range(program.start, program.end) if b in reduced_blocks]
    if mixed:
        buckets = FP32_BYTES * sum(profile.shard(b, tp).params for b in reduced)
    else:
        buckets = sum(profile.shard(b, tp).param_bytes for b in reduced)
    sharded = sum(
        profile.shard(b, tp).params for b in range(program.start, program.end) if (zero_holders or {}).get(b, 1) > 1
    )
    checkpoint = zero_checkpoint_bytes(sharded, optimizer=optimizer, dtype=dtype)
    return terms, gradients, optimizer_total, buckets, checkpoint


def _device_memory(
    program: DeviceProgram,
    profile: ModelProfile,
    *,
    optimizer: str,
    device_type: DeviceType,
    reduced_blocks: Collection[int],
    dtype: str,
    recompute: str,
    zero_holders: Mapping[int, int] | None,
    communicators: int,
    sync: SyncRole,
    statics: dict[tuple, tuple[StageTerms, float, float, float, float]],
) -> MemoryUse:
    """:func:`device_memory`, the stage's static figures shared through ``statics`` by every
    device whose stage holds the same blocks at the same degree, recomputation, holders and
    all-reduced blocks (the replicas of a plan's stages: one computation each, not one a device)."""
    mixed = dtype in MIXED_PRECISION
    start, end = program.start, program.end
    key = (
        start,
        end,
        program.tensor_parallel,
        recompute,
        tuple(b in reduced_blocks for b in range(start, end)),
        tuple((zero_holders or {}).get(b, 1) for b in range(start, end)),
    )
    figures = statics.get(key)
    if figures is None:
        figures = statics[key] = _static_figures(
            program,
            profile,
            optimizer=optimizer,
            dtype=dtype,
            recompute=recompute,
            reduced_blocks=reduced_blocks,
            zero_holders=zero_holders,
        )
    terms, gradients, optimizer_total, buckets, checkpoint = figures
    if sync.mode == "wsp":  # the optimizer steps on the parameter server: here only the fp32 master
        optimizer_total = FP32_BYTES * terms.params if mixed else 0.0
    weight_bytes = terms.weights
    held_per_sample = terms.held_per_sample
    grad_in, grad_out, workspace = terms.grad_in, terms.grad_out, terms.workspace
    # fp32 gradients are freed by the step (set to None) and come back with the step's first
    # backward; fp16/bf16 keep their fp32 buffers for the whole run (zeroed, not freed), as does a
    # ZeRO-1 holder under any dtype (its flat fp32 gradient buffer, planner/runtime/parallel/zero.py)
    persistent = mixed or any(h > 1 for h in key[5])
    late_grads = 0.0 if persistent else gradients

    held = peak = 0.0
    in_flight = peak_count = 0
    forward, backward = Kind.FORWARD, Kind.BACKWARD
    for action in program.actions:
        kind = action[0]
        samples = action[4] - action[3]  # its samples (hi - lo)
        if kind is forward:
            held += held_per_sample * samples
            in_flight += 1
            if held > peak:
                peak = held
            if in_flight > peak_count:
                peak_count = in_flight
        elif kind is backward:
            during = held + (grad_in + grad_out + workspace) * samples
            if during > peak:
                peak = during
            held += late_grads - held_per_sample * samples  # gradients arrive with the first backward
            late_grads = 0.0
            in_flight -= 1
            if held > peak:
                peak = held
    buffers = sync_buffers(sync, buckets, params=terms.params)
    # after the last backward: the buckets beside the gradients; then the sync mode's OPT, before and
    # after fp32 gradients are freed (``held`` still carries them here: the walk's frame)
    peak = max(peak, buckets + buffers.exchange + held, buffers.opt_with_grads + held, buffers.opt)
    if late_grads == 0.0 and not persistent:
        peak -= gradients  # the walk carried the gradients from the first backward on
    return MemoryUse(
        weights=weight_bytes,
        gradients=gradients,
        optimizer=optimizer_total,
        activations=peak,
        reserve=device_type.reserve_bytes,
        capacity=device_type.memory,
        peak_micro_batches=peak_count,
        fragmentation=device_type.fragmentation,
        checkpoint=checkpoint,
        comm_buffers=comm_buffer_bytes(device_type, communicators),
        sync_state=buffers.kept,
    )


def communicators_of(compiled: CompiledPlan, address: str) -> int:
    """The communicators a device belongs to, each with buffers of its own: every gradient group of
    more than one device it is in, its tensor-parallel group, and each point-to-point peer it sends
    to or receives from (NCCL connects each pair lazily, with buffers per connection)."""
    groups = sum(1 for g in compiled.groups if len(g.devices) > 1 and address in g.devices)
    return groups + _own_communicators(compiled.programs[address])


def _own_communicators(program: DeviceProgram) -> int:
    """:func:`communicators_of` less the gradient groups: the tensor-parallel group and the
    point-to-point peers (only transfer actions name a peer)."""
    peers = {a[2] for a in program.actions}
    peers.discard("")
    return (1 if program.tensor_parallel > 1 else 0) + len(peers)


def comm_buffer_bytes(device_type: DeviceType, communicators: int) -> float:
    """NCCL (RCCL) buffers of ``communicators`` on a type that runs the ``nccl`` backend (0 on
    gloo-only devices, whose buffers are small and transient): :data:`NCCL_CHANNELS` channels of one
    ``NCCL_BUFFSIZE`` receive buffer each."""
    if "nccl" not in device_type.backends:
        return 0.0
    return float(communicators * NCCL_CHANNELS * NCCL_BUFFSIZE)


#: Per profile (by identity, dropped with it): what it held (:class:`ProfileSnapshot`) and, per (optimizer, dtype),
#: the stage figures :func:`_device_memory` computed. A search walks the memory of thousands of plans
#: whose stages recur (the same cut at the same degree, recomputation and holders), each stage's
#: figures a sum over its blocks: computed once a profile, not once a plan.
_STATICS: dict[int, tuple[ProfileSnapshot, dict[tuple[str, str], dict[tuple, tuple]]]] = {}


def _statics_of(profile: ModelProfile, optimizer: str, dtype: str) -> dict[tuple, tuple]:
    """The stage figures already computed for ``profile`` at ``optimizer`` and ``dtype`` (a dict to
    fill); afresh where the profile changed what the figures read (:class:`ProfileSnapshot`)."""
    entry = _STATICS.get(id(profile))
    if entry is None or not entry[0].holds(profile):
        if entry is None:
            weakref.finalize(profile, _STATICS.pop, id(profile), None)
        entry = _STATICS[id(profile)] = (ProfileSnapshot.of(profile), {})
    return entry[1].setdefault((optimizer, dtype), {})


def static_stage_bytes(
    profile: ModelProfile, start: int, end: int, *, tp: int, dtype: str, optimizer: str, sync: str, zero: int
) -> float:
    """Weights, gradients and optimizer state (ZeRO-1's state left out: at least nothing) of one
    member of a degree-``tp`` stage holding blocks ``[start, end)``: what a device must hold before
    any activation (the memory walk's static part, or less). Kept per profile (:func:`_statics_of`):
    a search asks it of the same stages in thousands of plans."""
    cache = _statics_of(profile, optimizer, dtype)
    key = ("static", start, end, tp, sync == "wsp", bool(zero))
    found = cache.get(key)
    if found is None:
        mixed = dtype in MIXED_PRECISION
        terms = stage_terms(profile, start, end, tp=tp)
        gradients = FP32_BYTES * terms.params if mixed else terms.weights
        state = 0.0
        if sync == "wsp":  # the optimizer steps on the parameter server: no state here
            state = FP32_BYTES * terms.params if mixed else 0.0  # but the fp32 master copy
        elif not zero:
            state = optimizer_bytes(profile, start, end, optimizer=optimizer, dtype=dtype, tp=tp)
        found = cache[key] = terms.weights + gradients + state
    return found


def plan_memory(
    compiled: CompiledPlan,
    profile: ModelProfile,
    cluster,
    *,
    optimizer: str,
    dtype: str | None = None,
    plan: Plan | None = None,
    copies: Mapping[str, str] | None = None,
) -> dict[str, MemoryUse]:
    """:func:`device_memory` of every device of a compiled plan (``cluster``: a Cluster); ``plan``
    (the one compiled) gives each stage's ``recompute`` and ``zero`` (without it: none and 0).
    ``copies``: device -> a device whose memory it has (a pipeline that runs alike,
    :func:`hetplan.simulate.replicas.memory_copies`; its own program may be left uncompiled).
    A shared (tied) parameter's group adds a communicator on each holder (its copy's gradient is
    summed in place, no bucket)."""
    if plan is not None:
        profile = whole_vocab_profile(plan, profile)  # vocab_parallel: false stages hold the vocabulary whole
        compiled = with_shared_groups(compiled, plan, profile.shared)
    reduced: dict[str, set[int]] = {a: set() for a in compiled.programs}
    holders: dict[str, dict[int, int]] = {a: {} for a in compiled.programs}
    in_groups = dict.fromkeys(compiled.programs, 0)  # gradient groups of 2+ devices each device is in
    zero = plan is not None and plan.zero == 1
    for group in compiled.groups:
        if len(group.devices) > 1:
            for address in group.devices:
                reduced[address].update(group.blocks)
                if zero:
                    holders[address].update(dict.fromkeys(group.blocks, len(group.devices)))
            for address in set(group.devices):
                in_groups[address] += 1
    recompute = (
        {(pi, si): s.recompute for pi, p in enumerate(plan.pipelines) for si, s in enumerate(p.stages)}
        if plan is not None
        else {}
    )
    dtype = dtype or profile.dtype
    statics = _statics_of(profile, optimizer, dtype)
    roles = sync_roles(compiled, plan, optimizer=optimizer)
    copies = copies or {}
    walked = {
        address: _device_memory(
            program,
            profile,
            optimizer=optimizer,
            device_type=cluster.device(address).type,
            reduced_blocks=reduced[address],
            dtype=dtype,
            recompute=recompute.get((program.pipeline, program.stage), "none"),
            zero_holders=holders[address],
            communicators=in_groups[address] + _own_communicators(program),
            sync=roles[address],
            statics=statics,
        )
        for address, program in compiled.programs.items()
        if address not in copies
    }
    if not copies:
        return walked
    return {address: walked[copies.get(address, address)] for address in compiled.programs}

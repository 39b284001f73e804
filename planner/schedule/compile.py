"""Compile a plan into per-device action lists (GPipe or 1F1B), transfers and gradient groups.

    compiled = compile_plan(plan, n_blocks=24)
    compiled.programs["node0/0"].render()   # 'F0 SA0>node0/1 F1 ... B0 ... AR0 OPT'
    compiled.groups[0].devices              # devices that all-reduce group 0's gradients

Orders, stage ``s`` of ``S`` with ``M`` micro-batches:

* ``gpipe``: every forward, then every backward (ascending, as torch's ScheduleGPipe).
* ``1f1b``: ``min(S - s - 1, M)`` warm-up forwards, then one forward / one backward alternating,
  then the remaining backwards (PipeDream-flush). Stage ``s`` holds at most ``min(S - s, M)``
  micro-batches' activations.

What the actions mean at run time (the runtime does this, the simulator times it, the validator
checks it under NCCL's semantics):

* ``F``/``B`` compute; the device's host blocks while they run.
* a run of transfer actions with nothing between them is one *batch*, posted together
  (``torch.distributed.batch_isend_irecv``); the host waits for the batch's receives before its next
  action, its sends complete in the background and are waited on at ``OPT`` at the latest.
* ``AR`` actions sit right after the device's last backward: each gradient group's all-reduce is
  issued asynchronously the moment its gradients are final, during that backward once it has passed
  the group's blocks (gradient hooks, like DDP's buckets; groups in reverse block order, the order
  the backward finishes them), so it overlaps the rest of the backward, the trailing sends and the
  other devices' work; ``OPT`` waits for them, then steps.

A replicated stage's replica computes only its share of each micro-batch (whole samples, from
:func:`hetplan.contracts.plan.split_micro_batch`); between stages with different replica counts the
micro-batch is resharded: each pair of replicas exchanges the overlap of their sample ranges.

Tensor parallelism (a stage with ``tensor_parallel: t``): every member of a replica (its ``t``
devices) runs the replica's action list, each on its shard of the weights, and holds the whole
boundary tensor (Megatron's layers end in an all-reduce, inside ``F``/``B``). Across a boundary from
a replica of degree ``ts`` to one of degree ``tr``, member ``k`` of the receiver takes activations
from member ``k mod ts`` of the sender, and member ``k`` of the sender takes gradients from member
``k mod tr`` of the receiver: every member gets each tensor once, and equal degrees pair member with
member. A transfer into a member of a degree >= 2 replica carries only that member's chunk of the
tensor, and the receiving group all-gathers before the compute that consumes it (Megatron's
scatter/gather, :mod:`hetplan.schedule.boundary`): the action lists stay as they are. Gradient groups
are per shard: the ``k``-th members of every replica holding a block set
all-reduce together (:class:`GradGroup` ``tensor_parallel``, ``tp_rank``), so every holder of a
block must use the same degree (the plan contract checks it).
"""

from __future__ import annotations

import gc
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import NamedTuple

from hetplan.contracts.model_profile import SharedParams
from hetplan.contracts.plan import Plan, split_micro_batch
from hetplan.errors import HetplanError
from hetplan.schedule.actions import Action, Kind

__all__ = [
    "CompiledPlan",
    "DeviceProgram",
    "GradGroup",
    "Transfer",
    "compile_plan",
    "gradient_groups",
    "shared_groups",
    "stage_order",
    "with_shared_groups",
]


class Transfer(NamedTuple):
    """Samples ``[lo, hi)`` of micro-batch ``micro`` crossing boundary ``stage -> stage + 1`` of a pipeline.

    ``grad`` transfers go backwards (from ``stage + 1`` to ``stage``); their size equals the
    activation's, since the gradient of a tensor has its shape.
    """

    pipeline: int
    stage: int
    micro: int
    src: str
    dst: str
    lo: int
    hi: int
    grad: bool = False

    @property
    def samples(self) -> int:
        return self.hi - self.lo


@dataclass(frozen=True)
class GradGroup:
    """Blocks whose gradients live on the same set of devices: one all-reduce.

    With tensor parallelism each device holds ``1 / tensor_parallel`` of the blocks' sharded
    weights, shard ``tp_rank``; the group's devices are the holders of that shard.
    """

    id: int
    blocks: tuple[int, ...]
    devices: tuple[str, ...]
    tensor_parallel: int = 1
    tp_rank: int = 0
    #: a shared (tied) parameter's group (:func:`shared_groups`): the index of its entry in the
    #: model profile's ``shared`` list, ``blocks`` empty; -1 for a group of blocks
    shared: int = -1


@dataclass
class DeviceProgram:
    """What one device runs in one iteration."""

    address: str
    pipeline: int
    stage: int
    replica: int
    start: int
    end: int
    counts: tuple[int, ...]  # samples of each micro-batch this device computes
    offsets: tuple[int, ...]  # where its samples start inside each micro-batch
    actions: list[Action] = field(default_factory=list)
    tp_group: tuple[str, ...] = ()  # the devices of its tensor-parallel group, in rank order
    tp_rank: int = 0  # its place in ``tp_group``

    @property
    def tensor_parallel(self) -> int:
        return max(1, len(self.tp_group))

    def render(self) -> str:
        return " ".join(str(a) for a in self.actions)


@dataclass
class CompiledPlan:
    programs: dict[str, DeviceProgram]
    transfers: list[Transfer]
    groups: list[GradGroup]
    #: pipelines compiled without actions or transfers (their programs say only where each device
    #: sits and what share it computes): a simulation that copies them from pipelines that run alike
    #: (:mod:`hetplan.simulate.replicas`) needs no more of them
    skipped: frozenset[int] = frozenset()
    #: ``groups`` ends with the shared parameters' groups (:func:`shared_groups`; the simulator and
    #: the memory walk add them, the runtime makes its own: :mod:`hetplan.runtime.parallel.tied`)
    with_shared: bool = False


@lru_cache(maxsize=4096)
def stage_order(schedule: str, stage: int, n_stages: int, n_micro: int) -> tuple[tuple[Kind, int], ...]:
    """The compute order of one stage: ``[(F, 0), (F, 1), (B, 0), ...]``."""
    if schedule == "gpipe":
        return tuple([(Kind.FORWARD, j) for j in range(n_micro)] + [(Kind.BACKWARD, j) for j in range(n_micro)])
    warmup = min(n_stages - stage - 1, n_micro)
    order = [(Kind.FORWARD, j) for j in range(warmup)]
    for i in range(n_micro - warmup):
        order.append((Kind.FORWARD, warmup + i))
        order.append((Kind.BACKWARD, i))
    order.extend((Kind.BACKWARD, j) for j in range(n_micro - warmup, n_micro))
    return tuple(order)


def gradient_groups(plan: Plan, n_blocks: int) -> list[GradGroup]:
    """Group blocks by the set of devices that hold them; groups in reverse block order.

    Reverse block order is the order gradients become ready in the backward pass, so it is the
    order in which a device starts its all-reduces. The sync mode sets the scope: every holder
    (``allreduce``, ``adasum``, ``topk``), the holders inside each pipeline (``sdpipe``: pipelines
    meet by averaging weights), or none (``wsp``: the parameter server sums the pushes).
    """
    if plan.sync == "wsp":
        return []  # every device pushes its own gradient to the parameter server: no group reduces
    # SDPipe: the pipelines average weights in groups after stepping; gradients reduce inside each one
    scopes = [[p] for p in plan.pipelines] if plan.sync == "sdpipe" else [plan.pipelines]
    by_set: dict[tuple[str, ...], list[int]] = {}
    degree = [1] * n_blocks
    for pipelines in scopes:
        holders: list[list[str]] = [[] for _ in range(n_blocks)]
        for p in pipelines:
            for s in p.stages:
                for b in range(s.start, min(s.end, n_blocks)):
                    holders[b].extend(s.devices)
                    degree[b] = s.tensor_parallel  # one degree per block: the plan contract checks it
        for b in range(n_blocks):
            by_set.setdefault(tuple(holders[b]), []).append(b)
    ordered = sorted(by_set.items(), key=lambda item: (-max(item[1]), item[0]))
    groups: list[GradGroup] = []
    for devices, blocks in ordered:
        t = degree[blocks[0]]
        for k in range(t):  # the k-th member of every replica: the holders of shard k
            groups.append(GradGroup(len(groups), tuple(blocks), devices[k::t], tensor_parallel=t, tp_rank=k))
    return groups


def shared_groups(plan: Plan, shared: Sequence[SharedParams], first_id: int) -> list[GradGroup]:
    """One group per shared (tied) parameter entry and shard place, numbered from ``first_id``: the
    devices holding any of entry ``i``'s blocks (at degree ``t``, the ``k``-th members of
    each holding replica: shard ``k`` of a vocabulary-parallel tied table), in program order. The
    runtime sums such a gradient over exactly these devices at the step, after the gradient groups'
    all-reduces (:class:`hetplan.runtime.parallel.tied.TiedParams`). Empty for the sync modes that
    refuse tied parameters (only ``allreduce`` sums their gradients)."""
    if plan.sync != "allreduce":
        return []
    groups: list[GradGroup] = []
    for index, entry in enumerate(shared):
        places: dict[int, list[str]] = {}
        degree = 1
        for p in plan.pipelines:
            for s in p.stages:
                if entry.held_by(s.start, s.end):
                    degree = s.tensor_parallel
                    for i, address in enumerate(s.devices):
                        places.setdefault(i % s.tensor_parallel, []).append(address)
        for k in sorted(places):
            devices = tuple(places[k])
            groups.append(
                GradGroup(first_id + len(groups), (), devices, tensor_parallel=degree, tp_rank=k, shared=index)
            )
    return groups


def with_shared_groups(compiled: CompiledPlan, plan: Plan, shared: Sequence[SharedParams]) -> CompiledPlan:
    """``compiled`` with the shared parameters' groups after its own (:func:`shared_groups`); the
    same object where there are none or it has them already. No action is added: the simulator
    times them at the step and the walk counts their communicators."""
    if compiled.with_shared or not shared:
        return compiled
    extra = shared_groups(plan, shared, len(compiled.groups))
    return replace(compiled, groups=[*compiled.groups, *extra], with_shared=True)


def _reshard(
    pipeline: int, stage: int, micro: int, senders: list[DeviceProgram], receivers: list[DeviceProgram]
) -> list[Transfer]:
    """Transfers for one micro-batch across one boundary: the overlap of every sender/receiver pair."""
    out = []
    for s in senders:
        s_lo, s_hi = s.offsets[micro], s.offsets[micro] + s.counts[micro]
        for r in receivers:
            lo = max(s_lo, r.offsets[micro])
            hi = min(s_hi, r.offsets[micro] + r.counts[micro])
            if hi <= lo:
                continue
            if r.tp_rank % s.tensor_parallel == s.tp_rank:  # activations: receiver k from sender k mod ts
                out.append(Transfer(pipeline, stage, micro, s.address, r.address, lo, hi, grad=False))
            if s.tp_rank % r.tensor_parallel == r.tp_rank:  # gradients: sender k from receiver k mod tr
                out.append(Transfer(pipeline, stage, micro, r.address, s.address, lo, hi, grad=True))
    return out


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while building many small objects.

    Compiling and simulating a large plan allocates hundreds of thousands of tuples and lists and
    no reference cycles; each allocation burst would otherwise trigger full collections that scan
    every object built so far (a third of the time of a 512-device plan).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


#: The sync modes whose schedule is built here and which the simulator and the runtime carry out;
#: the plan contract names more (issue 11), refused with one line until they are built end to end.
BUILT_SYNC_MODES = ("allreduce", "adasum", "topk", "wsp", "sdpipe")


def compile_plan(plan: Plan, n_blocks: int, *, skip: Collection[int] = ()) -> CompiledPlan:
    """Per-device action lists, every transfer, and the gradient groups of ``plan``; the pipelines
    in ``skip`` without actions or transfers (:attr:`CompiledPlan.skipped`)."""
    if plan.sync not in BUILT_SYNC_MODES:
        raise HetplanError(
            f"sync mode {plan.sync} is in the plan contract but not yet built into the schedule, "
            f"simulator and runtime (built: {', '.join(BUILT_SYNC_MODES)})",
            file=plan.file,
            field="sync",
        )
    with gc_paused():
        return _compile(plan, n_blocks, frozenset(skip))


def _compile(plan: Plan, n_blocks: int, skip: frozenset[int] = frozenset()) -> CompiledPlan:
    programs: dict[str, DeviceProgram] = {}
    transfers: list[Transfer] = []
    stage_programs: list[list[list[DeviceProgram]]] = []
    for pi, p in enumerate(plan.pipelines):
        per_stage: list[list[DeviceProgram]] = []
        n_micro = len(p.micro_batches)
        for si, s in enumerate(p.stages):
            members = []
            if len(s.devices) == 1:  # split_micro_batch gives the whole micro-batch to the one device
                address = s.devices[0]
                program = DeviceProgram(address, pi, si, 0, s.start, s.end, tuple(p.micro_batches), (0,) * n_micro)
                programs[address] = program
                members.append(program)
            else:
                splits = [split_micro_batch(m, s.shares) for m in p.micro_batches]
                for ri, group in enumerate(s.replicas):
                    counts = tuple(split[ri] for split in splits)
                    offsets = tuple(sum(split[:ri]) for split in splits)
                    tp_group = group if s.tensor_parallel > 1 else ()
                    for k, address in enumerate(group):
                        program = DeviceProgram(
                            address, pi, si, ri, s.start, s.end, counts, offsets, tp_group=tp_group, tp_rank=k
                        )
                        programs[address] = program
                        members.append(program)
            per_stage.append(members)
        stage_programs.append(per_stage)

    # per device and micro-batch: (peer, lo, hi) of activations in/out and of gradients in/out,
    # in the order of ``transfers`` (the order the device posts them)
    act_in: dict[str, list[list[tuple[str, int, int]]]] = {}
    act_out: dict[str, list[list[tuple[str, int, int]]]] = {}
    grad_in: dict[str, list[list[tuple[str, int, int]]]] = {}
    grad_out: dict[str, list[list[tuple[str, int, int]]]] = {}
    for pi, p in enumerate(plan.pipelines):
        if pi in skip:
            continue
        n_micro = len(p.micro_batches)
        for stage in stage_programs[pi]:
            for program in stage:
                for table in (act_in, act_out, grad_in, grad_out):
                    table[program.address] = [[] for _ in range(n_micro)]

    new = tuple.__new__  # NamedTuple construction without the generated __new__'s Python frame
    for pi, p in enumerate(plan.pipelines):
        if pi in skip:
            continue
        per_stage = stage_programs[pi]
        for si in range(len(p.stages) - 1):
            senders, receivers = per_stage[si], per_stage[si + 1]
            if len(senders) == 1 and len(receivers) == 1:  # the common case: whole micro-batches
                src, dst = senders[0].address, receivers[0].address
                s_out, d_in, d_out, s_in = act_out[src], act_in[dst], grad_out[dst], grad_in[src]
                for j, m in enumerate(p.micro_batches):
                    if m > 0:
                        transfers.append(new(Transfer, (pi, si, j, src, dst, 0, m, False)))
                        transfers.append(new(Transfer, (pi, si, j, dst, src, 0, m, True)))
                        s_out[j].append((dst, 0, m))
                        d_in[j].append((src, 0, m))
                        d_out[j].append((src, 0, m))
                        s_in[j].append((dst, 0, m))
                continue
            # micro-batches split alike (most are one size) exchange alike: each split pattern once
            patterns: dict[tuple, list[Transfer]] = {}
            for j in range(len(p.micro_batches)):
                split = (
                    tuple((x.offsets[j], x.counts[j]) for x in senders),
                    tuple((x.offsets[j], x.counts[j]) for x in receivers),
                )
                pattern = patterns.get(split)
                if pattern is None:
                    pattern = patterns[split] = _reshard(pi, si, j, senders, receivers)
                for t in pattern:
                    if t.micro != j:
                        t = new(Transfer, (pi, si, j, t.src, t.dst, t.lo, t.hi, t.grad))
                    transfers.append(t)
                    (grad_out if t.grad else act_out)[t.src][j].append((t.dst, t.lo, t.hi))
                    (grad_in if t.grad else act_in)[t.dst][j].append((t.src, t.lo, t.hi))

    groups = gradient_groups(plan, n_blocks)
    reduces: dict[str, list[Action]] = {a: [] for a in programs}
    for g in groups:
        if len(g.devices) > 1:
            action = Action(Kind.ALLREDUCE, group=g.id)
            for address in dict.fromkeys(g.devices):
                reduces[address].append(action)

    forward, backward = Kind.FORWARD, Kind.BACKWARD
    recv_act, send_act, recv_grad, send_grad = Kind.RECV_ACT, Kind.SEND_ACT, Kind.RECV_GRAD, Kind.SEND_GRAD
    step = Action(Kind.STEP)
    for pi, p in enumerate(plan.pipelines):
        if pi in skip:
            continue
        for si in range(len(p.stages)):
            order = stage_order(plan.schedule, si, len(p.stages), len(p.micro_batches))
            for program in stage_programs[pi][si]:
                actions = program.actions
                append = actions.append
                address, counts, offsets = program.address, program.counts, program.offsets
                a_in, a_out, g_in, g_out = act_in[address], act_out[address], grad_in[address], grad_out[address]
                last_backward = max(
                    (i for i, (kind, j) in enumerate(order) if kind is backward and counts[j]), default=-1
                )
                for i, (kind, j) in enumerate(order):
                    count = counts[j]
                    if count == 0:
                        continue
                    lo = offsets[j]
                    if kind is backward:
                        for peer, t_lo, t_hi in g_in[j]:
                            append(new(Action, (recv_grad, j, peer, t_lo, t_hi, -1)))
                        append(new(Action, (backward, j, "", lo, lo + count, -1)))
                        if i == last_backward:  # every gradient is final: issue the all-reduces now
                            actions.extend(reduces[address])
                        for peer, t_lo, t_hi in g_out[j]:
                            append(new(Action, (send_grad, j, peer, t_lo, t_hi, -1)))
                    else:
                        for peer, t_lo, t_hi in a_in[j]:
                            append(new(Action, (recv_act, j, peer, t_lo, t_hi, -1)))
                        append(new(Action, (forward, j, "", lo, lo + count, -1)))
                        for peer, t_lo, t_hi in a_out[j]:
                            append(new(Action, (send_act, j, peer, t_lo, t_hi, -1)))
                if last_backward < 0:  # a device with no samples at all still joins its all-reduces
                    actions.extend(reduces[address])
                append(step)
    return CompiledPlan(programs=programs, transfers=transfers, groups=groups, skipped=skip)

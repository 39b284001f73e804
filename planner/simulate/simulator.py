"""Simulate one training iteration of a plan: the ground truth for every predicted figure.

    result = simulate(plan, profile, cluster)
    result.iteration_s, result.samples_per_s, result.bubble_fraction
    result.devices["node0/0"].memory.fits
    result.critical_path            # [(what, seconds on the path), ...] longest first

The plan compiles to per-device action lists (:mod:`hetplan.schedule`); each action becomes a task
of a discrete-event run (:mod:`hetplan.simulate.engine`): forwards and backwards on their device in
list order, activation and gradient transfers on the link between their two devices (inter-node
transfers share each node's network link), each starting once its data is produced and its receiver
has posted the receive (the receiver's compute before it has ended: NCCL's rendezvous), one
all-reduce per gradient group issued asynchronously the moment its gradients are final on every
holder: part-way through each holder's last backward, once that backward has passed the group's
blocks (the runtime issues it from gradient hooks, as DDP issues its buckets; a device's
all-reduces in group order), then the optimizer step, which waits for the device's all-reduces and
its sends.

Tensor parallelism, recomputation and ZeRO-1 (docs/cost-model.md): a member of a tensor-parallel
replica runs each F and B at its degree's compute plus its blocks' all-reduces on its node's link
(:func:`hetplan.simulate.costs.block_costs`), with what its stage's ``recompute`` adds to each B;
its gradient groups are per shard (one shard's bytes). Sync modes: ``adasum`` and ``topk`` replace
each group's all-reduce by an all-gather of every holder's contribution (whole, or ``k`` index-value
pairs); ``wsp`` has no group and each step pays its share of the wave's push and pull through the
central process; ``sdpipe`` reduces inside each pipeline, each step pays the weight swap with its
group, and the pipelines run at their own paces (the iteration is the global batch over the sum of
their rates). What the simulator cannot know: how many more steps stale or sparsified updates need
(docs/cost-model.md). With ``plan.zero == 1`` each shared group's
all-reduce becomes a reduce-scatter (issued from the same hooks, half the all-reduce's time), each
holder steps only its 1/n of the group's parameters, and an all-gather of the updated parameters
(half an all-reduce) follows once every holder has stepped: it ends the iteration (the next
iteration's first forward needs the parameters).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import numpy as np

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan, check_plan
from hetplan.errors import HetplanError
from hetplan.schedule.actions import Kind
from hetplan.schedule.boundary import piece
from hetplan.schedule.compile import CompiledPlan, GradGroup, Transfer, compile_plan, gc_paused, with_shared_groups
from hetplan.simulate.central import CentralMemory, central_memory
from hetplan.simulate.costs import CostModel, shared_cost_model
from hetplan.simulate.engine import Engine
from hetplan.simulate.memory import MemoryUse, plan_memory, static_stage_bytes
from hetplan.simulate.replicas import Folding, fold_replicas, memory_copies, uncompiled_pipelines
from hetplan.simulate.vocab import whole_vocab_profile

__all__ = [
    "DeviceStats",
    "SimResult",
    "StageStats",
    "Walked",
    "check_memory",
    "memory_if_fits",
    "simulate",
    "simulate_if_fits",
    "simulate_walked",
]


class TaskInfo(NamedTuple):
    """What a task of the engine stands for (for the timeline, the critical path and errors)."""

    kind: str  # "F", "B", "send", "allreduce", "step", "gather" (a split boundary's all-gather)
    device: str  # the device row it is drawn on (the sender for a transfer)
    pipeline: int
    stage: int
    micro: int = -1
    peer: str = ""
    group: int = -1
    op: str = ""  # for a group's collective: "all-reduce" (default), "reduce-scatter", "all-gather"

    def __str__(self) -> str:
        where = f"pipeline {self.pipeline} stage {self.stage} on {self.device}"
        if self.kind in ("F", "B"):
            return f"{self.kind}{self.micro} of {where}"
        if self.kind == "send":
            return f"transfer of micro-batch {self.micro} {self.device} -> {self.peer}"
        if self.kind == "allreduce":
            return f"{self.op or 'all-reduce'} of gradient group {self.group}"
        if self.kind == "gather":
            return f"{self.op} of micro-batch {self.micro} in {where}"
        return f"optimizer step of {where}"


@dataclass
class DeviceStats:
    address: str
    type: str
    pipeline: int
    stage: int
    compute_s: float  # forward + backward
    optimizer_s: float
    comm_s: float  # time with a transfer or all-reduce of this device in flight
    idle_s: float  # iteration minus compute and optimizer
    memory: MemoryUse


@dataclass
class StageStats:
    pipeline: int
    stage: int
    blocks: tuple[int, int]
    devices: tuple[str, ...]
    fwd_s: float  # summed over micro-batches, slowest replica
    bwd_s: float
    send_s: float  # transfers this stage sends (activations forward, gradients back), summed


@dataclass
class SimResult:
    iteration_s: float
    global_batch: int
    bubble_fraction: float
    devices: dict[str, DeviceStats]
    stages: list[StageStats]
    critical_path: list[tuple[str, float]]
    bottleneck: str
    timeline: list[tuple[str, str, float, float, str]] = field(default_factory=list)  # row, kind, start, end, label
    n_tasks: int = 0
    central: CentralMemory | None = None  # wsp: the parameter server's host memory (simulate.central)

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.iteration_s if self.iteration_s > 0 else float("inf")

    def predicted(self) -> dict[str, Any]:
        """The plan file's ``predicted`` section."""
        return {
            "iteration_s": round(self.iteration_s, 9),
            "samples_per_s": round(self.samples_per_s, 6),
            "bubble_fraction": round(self.bubble_fraction, 6),
            "bottleneck": self.bottleneck,
            "stages": [
                {
                    "pipeline": s.pipeline,
                    "stage": s.stage,
                    "fwd_s": round(s.fwd_s, 9),
                    "bwd_s": round(s.bwd_s, 9),
                    "send_s": round(s.send_s, 9),
                }
                for s in self.stages
            ],
            "memory": {
                a: {
                    "peak_bytes": round(d.memory.total),
                    "tensor_bytes": round(d.memory.tensor_bytes),
                    "capacity_bytes": round(d.memory.capacity),
                    "fits": d.memory.fits,
                }
                for a, d in self.devices.items()
            },
            **({"central": self.central.to_dict()} if self.central is not None else {}),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            **({"central": self.central.to_dict()} if self.central is not None else {}),
            "iteration_s": self.iteration_s,
            "samples_per_s": self.samples_per_s,
            "bubble_fraction": self.bubble_fraction,
            "bottleneck": self.bottleneck,
            "critical_path": [{"what": w, "seconds": s} for w, s in self.critical_path],
            "devices": {
                a: {
                    "type": d.type,
                    "pipeline": d.pipeline,
                    "stage": d.stage,
                    "compute_s": d.compute_s,
                    "optimizer_s": d.optimizer_s,
                    "comm_s": d.comm_s,
                    "idle_s": d.idle_s,
                    "peak_memory_bytes": d.memory.total,
                    "tensor_bytes": d.memory.tensor_bytes,
                    "memory_fits": d.memory.fits,
                    "capacity_bytes": d.memory.capacity,
                    "over_bytes": max(0.0, d.memory.total - d.memory.capacity),
                }
                for a, d in self.devices.items()
            },
            "stages": [s.__dict__ | {"blocks": list(s.blocks), "devices": list(s.devices)} for s in self.stages],
        }


#: Up to this many intervals :func:`_union_lengths` runs the plain loop: numpy's cost per call
#: exceeds the loop's below it (a search's refinement simulates thousands of small plans).
_LOOP_UNION = 256


def _union_lengths(rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, n_rows: int) -> list[float]:
    """The total length each row's intervals cover (overlaps counted once), for every row at once.

    Exactly the float operations of the plain loop (:func:`_union_lengths_loop`), vectorised:
    sort by (row, lo, hi); an interval opens a new merged segment when it starts after every
    earlier interval of its row has ended. The running maximum of ``hi`` restarts at each row by
    taking it over integer keys ``row * n + rank(hi)`` (rows ascend, so earlier rows never win).
    """
    n = len(rows)
    if n == 0:
        return [0.0] * n_rows
    if n <= _LOOP_UNION:
        return _union_lengths_loop(rows.tolist(), lo.tolist(), hi.tolist(), n_rows)
    order = np.lexsort((hi, lo, rows))
    rows, lo, hi = rows[order], lo[order], hi[order]
    by_hi = np.argsort(hi, kind="stable")
    rank = np.empty(n, dtype=np.int64)
    rank[by_hi] = np.arange(n, dtype=np.int64)
    reach = np.maximum.accumulate(rows.astype(np.int64) * n + rank)  # latest end so far, as a key
    reach_hi = hi[by_hi[reach - rows.astype(np.int64) * n]]  # ... and as a time
    opens = np.ones(n, dtype=bool)
    opens[1:] = (rows[1:] != rows[:-1]) | (lo[1:] > reach_hi[:-1])
    first = np.flatnonzero(opens)
    last = np.append(first[1:] - 1, n - 1)
    lengths = reach_hi[last] - lo[first]
    return np.bincount(rows[first], weights=lengths, minlength=n_rows).tolist()


def _union_lengths_loop(rows: list[int], lo: list[float], hi: list[float], n_rows: int) -> list[float]:
    """:func:`_union_lengths` as the plain loop: sort the ``(row, lo, hi)`` triples; merge an
    interval into the row's current run while it starts no later than the run's end; add each
    run's ``end - start`` to its row in order."""
    totals = [0.0] * n_rows
    run_row, run_lo, run_hi = -1, 0.0, 0.0
    for r, a, b in sorted(zip(rows, lo, hi, strict=True)):
        if r == run_row and a <= run_hi:
            if b > run_hi:
                run_hi = b
            continue
        if run_row >= 0:
            totals[run_row] += run_hi - run_lo
        run_row, run_lo, run_hi = r, a, b
    if run_row >= 0:
        totals[run_row] += run_hi - run_lo
    return totals


#: The ``op`` of ZeRO-1's all-gather of updated parameters (after every holder's step): the tasks
#: numbered last, which :class:`_FoldedNames` tells apart from the collectives before the steps.
_ZERO_GATHER = "all-gather"

# task kinds in _Tasks.kind
_F, _B, _SEND, _AR, _STEP, _GATHER = 0, 1, 2, 3, 4, 5


class _Tasks(NamedTuple):
    """Parallel to the engine's tasks: what each stands for, as small ints (for vectorised statistics)."""

    kind: list[int]  # _F, _B, _SEND, _AR or _STEP
    row: list[int]  # index of the device (in ``compiled.programs`` order); the sender of a transfer; -1
    peer: list[int]  # the receiver of a transfer, the group of an all-reduce; -1 otherwise


def _build(
    compiled: CompiledPlan,
    costs: CostModel,
    cluster: Cluster,
    plan: Plan | None = None,
    kept: Collection[str] | None = None,
) -> tuple[Engine, _Tasks, dict]:
    """Tasks and edges for one iteration; returns the engine, what each task is, and resource capacities.

    Task order (and so the engine's tie-breaking): every device's forwards and backwards in
    program order, then the transfers in ``compiled.transfers`` order, the all-reduces in group
    order, and the optimizer steps. ``kept``: only these devices' tasks (the pipelines a
    :class:`~hetplan.simulate.replicas.Folding` runs); the collectives are priced over every holder.
    """
    engine = Engine()
    programs = compiled.programs
    index = {a: i for i, a in enumerate(programs)}
    kinds: list[int] = []
    rows: list[int] = []
    peers: list[int] = []
    nxt, npred = engine.next, engine.npred
    new = tuple.__new__  # NamedTuple construction without the generated __new__'s Python frame
    forward, backward_kind = Kind.FORWARD, Kind.BACKWARD
    fwd_task: dict[str, list[int]] = {}  # device -> task of each micro-batch's forward (-1: none)
    bwd_task: dict[str, list[int]] = {}
    fwd_posted: dict[str, list[int]] = {}  # device -> the compute task after which F_j's receives are posted
    bwd_posted: dict[str, list[int]] = {}
    last_compute: dict[str, int] = {}
    last_backward: dict[str, tuple[int, int]] = {}  # device -> (task, samples) of its last backward
    devices = {a: cluster.device(a) for a in programs}
    recompute_of = _recompute_of(plan)
    zero = plan is not None and plan.zero == 1
    sync = plan.sync if plan is not None else "allreduce"
    ratio = float(plan.sync_option("ratio")) if sync == "topk" else 1.0
    for row, (address, program) in enumerate(programs.items()):
        if kept is not None and address not in kept:
            continue
        device = devices[address]
        pipeline, stage, start, end = program.pipeline, program.stage, program.start, program.end
        tp, recompute = program.tensor_parallel, recompute_of.get((pipeline, stage), "none")
        f_ids = [-1] * len(program.counts)
        b_ids = [-1] * len(program.counts)
        posted_f = [-1] * len(program.counts)  # the compute before F_j: its receives are posted after it
        posted_b = [-1] * len(program.counts)
        seconds_of: dict[int, float] = {}  # 2 * samples + backward -> seconds (stage compute per share)
        durations: list[float] = []
        metas: list[TaskInfo] = []
        task = len(engine)
        last_b = (-1, 0)
        for action in program.actions:
            kind = action[0]
            if kind is forward:
                backward = 0
            elif kind is backward_kind:
                backward = 1
            else:
                continue
            micro, samples = action[1], action[4] - action[3]
            key = 2 * samples + backward
            seconds = seconds_of.get(key)
            if seconds is None:
                seconds = seconds_of[key] = costs.compute(
                    device, start, end, samples, backward=bool(backward), tp=tp, recompute=recompute
                )
            durations.append(seconds)
            if backward:
                metas.append(new(TaskInfo, ("B", address, pipeline, stage, micro, "", -1)))
                b_ids[micro] = task
                posted_b[micro] = task - 1 if durations[:-1] else -1
                last_b = (task, samples)
            else:
                metas.append(new(TaskInfo, ("F", address, pipeline, stage, micro, "", -1)))
                f_ids[micro] = task
                posted_f[micro] = task - 1 if durations[:-1] else -1
            kinds.append(backward)  # _F == 0, _B == 1
            task += 1
        ids = engine.add_fixed_many(durations, metas, chain=True)
        rows.extend([row] * len(ids))
        peers.extend([-1] * len(ids))
        fwd_task[address], bwd_task[address] = f_ids, b_ids
        fwd_posted[address], bwd_posted[address] = posted_f, posted_b
        last_compute[address] = ids[-1] if ids else -1
        if last_b[0] >= 0:
            last_backward[address] = last_b

    capacity: dict[Any, float] = {}
    for node in cluster.nodes:
        capacity[("out", node.name)] = node.nic_bandwidth
        capacity[("in", node.name)] = node.nic_bandwidth
    node_of = {a: d.node for a, d in devices.items()}
    per_sample = {a: costs.boundary_bytes(p.end, 1) for a, p in programs.items()}  # bytes out of its stage
    links: dict[tuple[str, str], Any] = {}
    durations, flows, metas = [], [], []
    receivers: list[int] = []  # the compute task each transfer releases
    pred_counts: list[int] = []  # tasks each transfer waits for
    senders_of: dict[str, list[int]] = {}  # device -> transfers it sends (waited on before its step)
    transfers = compiled.transfers if kept is None else [tr for tr in compiled.transfers if tr.src in kept]
    gathers = _boundary_gathers(
        compiled, transfers, costs, devices, per_sample, engine, fwd_task, bwd_task, fwd_posted, bwd_posted
    )
    kinds.extend([_GATHER] * len(gathers))
    rows.extend(index[key[0][0]] for key in gathers)
    peers.extend([-1] * len(gathers))
    task = len(engine)
    for tr in transfers:
        pipeline, stage, micro, src, dst, lo, hi, grad = tr
        src_node, dst_node = node_of[src], node_of[dst]
        receiver = programs[dst]
        if receiver.tp_group:  # split into the receiving TP group: this member's chunk (schedule/boundary.py)
            a, b = piece(lo, hi, per_sample[dst if grad else src], receiver, micro)
            nbytes = max(0.0, b - a)
        else:
            nbytes = per_sample[dst if grad else src] * (hi - lo)
        link = links.get((src_node, dst_node))
        if link is None:
            link = links[(src_node, dst_node)] = cluster.link(devices[src], devices[dst])
        if grad:
            metas.append(new(TaskInfo, ("send", src, pipeline, stage + 1, micro, dst, -1)))
            before, after, posted = bwd_task[src][micro], bwd_task[dst][micro], bwd_posted[dst][micro]
        else:
            metas.append(new(TaskInfo, ("send", src, pipeline, stage, micro, dst, -1)))
            before, after, posted = fwd_task[src][micro], fwd_task[dst][micro], fwd_posted[dst][micro]
        if link.shared and nbytes > 0:  # nothing to send costs nothing, as on a node's own link
            durations.append(0.0)
            resources = (("out", src_node), ("in", dst_node))
            flows.append((float(nbytes), float(link.latency), float(link.bandwidth), resources))
        else:
            durations.append(link.transfer_time(nbytes))
            flows.append(None)
        nxt[before].append(task)  # the transfer waits for the compute that produces its data ...
        n_pred = 1
        if posted >= 0:  # ... and for the receiver to post its receive (a rendezvous, as NCCL's)
            nxt[posted].append(task)
            n_pred += 1
        pred_counts.append(n_pred)
        if receiver.tp_group:  # ... and the receiving group's all-gather, which the compute waits for
            after = gathers[(receiver.tp_group, micro, grad)]
        npred[after] += 1  # ... and the compute that consumes it waits for the transfer
        receivers.append(after)
        senders_of.setdefault(src, []).append(task)
        task += 1
    ids = engine.add_many(durations, flows, metas)
    for t, after, n_pred in zip(ids, receivers, pred_counts, strict=True):
        nxt[t].append(after)
        npred[t] += n_pred
    kinds.extend([_SEND] * len(ids))
    rows.extend(index[tr.src] for tr in transfers)
    peers.extend(index[tr.dst] for tr in transfers)

    done_comm: dict[str, list[int]] = {a: [] for a in programs}
    last_comm: dict[str, int] = {}
    holders: dict[str, dict[int, int]] = {a: {} for a in programs}  # ZeRO-1: block -> holders sharing its step
    gathers: list[tuple[int, float]] = []  # ZeRO-1: (group, all-gather seconds)
    overlapping: dict[str, list[tuple[float, float]]] = {}  # device -> (release in its last B, seconds)
    for group in compiled.groups:
        if len(group.devices) <= 1:
            continue
        members = [devices[a] for a in group.devices]
        if group.shared >= 0:  # a tied copy's gradient: summed over its holders at the step
            _shared_allreduce(engine, group, costs, members, last_compute, last_comm, done_comm, kept, senders_of)
            kinds.append(_AR)
            rows.append(-1)
            peers.append(group.id)
            continue
        nbytes = costs.gradient_bytes(group.blocks, tp=group.tensor_parallel)
        if zero:
            seconds = costs.reduce_scatter(nbytes, members)
            info = TaskInfo("allreduce", group.devices[0], -1, -1, group=group.id, op="reduce-scatter")
            gathers.append((group.id, costs.all_gather(nbytes, members)))
            for address in group.devices:
                holders[address].update(dict.fromkeys(group.blocks, len(group.devices)))
        elif sync in ("adasum", "topk"):
            # every holder all-gathers every holder's contribution: all of it (Adasum), or k entries
            # of 8-byte index + 4-byte value (top-k); an all-gather of the n parts
            n = len(members)
            part = nbytes if sync == "adasum" else 12.0 * math.ceil(ratio * nbytes / 4.0)
            seconds = costs.all_gather(n * part, members)
            info = TaskInfo("allreduce", group.devices[0], -1, -1, group=group.id, op=f"{sync} all-gather")
        else:
            seconds = costs.allreduce(nbytes, members)
            info = TaskInfo("allreduce", group.devices[0], -1, -1, group=group.id)
        t = engine.add_fixed(seconds, info)
        kinds.append(_AR)
        rows.append(-1)
        peers.append(group.id)
        for address in group.devices:
            if kept is not None and address not in kept:
                continue
            program = programs[address]
            if address in last_backward:
                last_b, samples = last_backward[address]
                lowest = min(b for b in group.blocks if program.start <= b < program.end)
                per_block = costs.block_times(
                    devices[address],
                    samples,
                    backward=True,
                    tp=program.tensor_parallel,
                    recompute=recompute_of.get((program.pipeline, program.stage), "none"),
                )
                offset = sum(per_block[lowest : program.end])
                engine.add_edge(last_b, t, offset=offset)
                overlapping.setdefault(address, []).append((offset, seconds))
            if address in last_comm:
                engine.add_edge(last_comm[address], t)
            last_comm[address] = t
            done_comm[address].append(t)

    for address, collectives in overlapping.items():
        slowdown = devices[address].type.overlap_slowdown
        if slowdown > 1.0:
            last_b = last_backward[address][0]
            engine.duration[last_b] += (slowdown - 1.0) * overlapped_span(engine.duration[last_b], collectives)

    step_of: dict[str, int] = {}
    exchange = _decentralised_exchange(plan, compiled, costs)
    for row, (address, program) in enumerate(programs.items()):
        if kept is not None and address not in kept:
            continue
        info = TaskInfo("step", address, program.pipeline, program.stage)
        seconds = costs.optimizer_step(
            devices[address], program.start, program.end, tp=program.tensor_parallel, holders=holders[address]
        )
        if plan is not None and plan.sync == "wsp":
            seconds = 0.0  # the parameter server steps (its own process); the device pushes and pulls
        seconds += exchange.get(address, 0.0)
        t = engine.add_fixed(seconds, info)
        step_of[address] = t
        kinds.append(_STEP)
        rows.append(row)
        peers.append(-1)
        if last_compute[address] >= 0:
            engine.add_edge(last_compute[address], t)
        for c in done_comm[address]:
            engine.add_edge(c, t)
        for c in senders_of.get(address, ()):  # the step waits for the device's sends to complete
            engine.add_edge(c, t)

    last_gather: dict[str, int] = {}
    for gid, seconds in gathers:  # ZeRO-1: updated parameters gathered once every holder has stepped
        group = compiled.groups[gid]
        t = engine.add_fixed(seconds, TaskInfo("allreduce", group.devices[0], -1, -1, group=gid, op=_ZERO_GATHER))
        kinds.append(_AR)
        rows.append(-1)
        peers.append(gid)
        for address in group.devices:
            if kept is not None and address not in kept:
                continue
            engine.add_edge(step_of[address], t)
            if address in last_gather:  # a device's collectives run in group order
                engine.add_edge(last_gather[address], t)
            last_gather[address] = t
    return engine, _Tasks(kinds, rows, peers), capacity


def _shared_allreduce(
    engine: Engine,
    group: GradGroup,
    costs: CostModel,
    members: list,
    last_compute: dict[str, int],
    last_comm: dict[str, int],
    done_comm: dict[str, list[int]],
    kept: Collection[str] | None,
    senders_of: dict[str, list[int]],
) -> int:
    """The all-reduce of a shared (tied) parameter's gradient: issued at the step by every holder,
    once its backward is over, its sends have completed and its gradient groups' all-reduces are
    done (the runtime's order at ``OPT``, ``executor.py``: sends, groups, then
    :meth:`hetplan.runtime.parallel.tied.TiedParams.all_reduce`), so it overlaps no compute; each
    holder's step waits for it."""
    nbytes = costs.shared_gradient_bytes(group.shared, tp=group.tensor_parallel)
    name = costs.profile.shared[group.shared].name
    info = TaskInfo("allreduce", group.devices[0], -1, -1, group=group.id, op=f"tied all-reduce ({name})")
    t = engine.add_fixed(costs.allreduce(nbytes, members), info)
    for address in group.devices:
        if kept is not None and address not in kept:
            continue
        if last_compute.get(address, -1) >= 0:
            engine.add_edge(last_compute[address], t)
        if address in last_comm:
            engine.add_edge(last_comm[address], t)
        for c in senders_of.get(address, ()):
            engine.add_edge(c, t)
        last_comm[address] = t
        done_comm[address].append(t)
    return t


def _boundary_gathers(
    compiled: CompiledPlan,
    transfers: list[Transfer],
    costs: CostModel,
    devices: dict,
    per_sample: dict[str, float],
    engine: Engine,
    fwd_task: dict[str, list[int]],
    bwd_task: dict[str, list[int]],
    fwd_posted: dict[str, list[int]],
    bwd_posted: dict[str, list[int]],
) -> dict[tuple[tuple[str, ...], int, bool], int]:
    """One all-gather task per tensor-parallel replica, micro-batch and direction that receives split
    transfers (:mod:`hetplan.schedule.boundary`): the replica's whole buffer gathered in a ring over
    its node (:meth:`CostModel.all_gather`), once every member has posted its receives; each
    member's F (activations) or B (gradients) waits for it. Keyed ``(tp_group, micro, grad)``."""
    out: dict[tuple[tuple[str, ...], int, bool], int] = {}
    programs = compiled.programs
    # a group's gather of one size is priced once: its micro-batches are mostly of one size
    priced: dict[tuple[tuple[str, ...], float], float] = {}
    for tr in transfers:
        receiver = programs[tr.dst]
        key = (receiver.tp_group, tr.micro, tr.grad)
        if not receiver.tp_group or key in out:
            continue
        row = per_sample[tr.dst] if tr.grad else per_sample[tr.src]
        nbytes = row * receiver.counts[tr.micro]
        seconds = priced.get((receiver.tp_group, nbytes))
        if seconds is None:
            members = [devices[a] for a in receiver.tp_group]
            seconds = priced[(receiver.tp_group, nbytes)] = costs.all_gather(nbytes, members)
        info = TaskInfo(
            "gather", receiver.tp_group[0], receiver.pipeline, receiver.stage, tr.micro, op="boundary all-gather"
        )
        t = out[key] = engine.add_fixed(seconds, info)
        consumer, posted = (bwd_task, bwd_posted) if tr.grad else (fwd_task, fwd_posted)
        for a in receiver.tp_group:
            if posted[a][tr.micro] >= 0:  # every member has reached the compute before it
                engine.add_edge(posted[a][tr.micro], t)
            engine.add_edge(t, consumer[a][tr.micro])
    return out


def overlapped_span(backward: float, collectives: list[tuple[float, float]]) -> float:
    """Seconds of a ``backward`` of that length during which a collective it issued runs: each
    ``(release, seconds)`` starts at its release (offset into the backward) or when the device's
    previous collective ends, whichever is later. The device's own view: a collective held back by
    a slower holder overlaps less in fact (the cost model's approximation, docs/cost-model.md,
    "Overlap"); the rest of the backward is stretched by the type's ``overlap_slowdown`` on it."""
    span, free = 0.0, 0.0
    for release, seconds in collectives:
        lo = max(release, free)
        free = lo + seconds
        span += max(0.0, min(free, backward) - min(lo, backward))
    return span


def _decentralised_exchange(plan: Plan | None, compiled: CompiledPlan, costs: CostModel) -> dict[str, float]:
    """Seconds each device spends, per step, on the decentralised modes' weight traffic (added to
    its step): ``wsp`` pushes its gradient and pulls its weights (fp32) through the central process
    on the first device's node, all devices at once at a wave's end, so every one waits for the
    whole exchange over the slowest path to that node (amortised over the wave's steps); ``sdpipe``
    swaps its weights with ``group_size - 1`` counterparts (their links, in parallel)."""
    if plan is None or plan.sync not in ("wsp", "sdpipe"):
        return {}
    programs = compiled.programs
    nbytes = {a: costs.gradient_bytes(tuple(range(p.start, p.end)), tp=p.tensor_parallel) for a, p in programs.items()}
    link = costs.cluster.link
    if plan.sync == "wsp":
        central = next(iter(programs))  # the central process runs on this device's node
        slowest = min((link(a, central) for a in programs), key=lambda x: x.bandwidth)
        seconds = 2.0 * (sum(nbytes.values()) / slowest.bandwidth + slowest.latency)
        return dict.fromkeys(programs, seconds / int(plan.sync_option("wave")))
    group = int(plan.sync_option("group_size"))
    out = {}
    for a, p in programs.items():
        peers = [
            b for b, q in programs.items() if q.pipeline != p.pipeline and (q.stage, q.replica) == (p.stage, p.replica)
        ]
        if peers:
            path = min((link(a, b) for b in peers), key=lambda x: x.bandwidth)
            out[a] = min(group - 1, len(peers)) * (nbytes[a] / path.bandwidth + path.latency)
    return out


def _recompute_of(plan: Plan | None) -> dict[tuple[int, int], str]:
    """(pipeline, stage) -> the stage's recomputation, for the stages that recompute."""
    if plan is None:
        return {}
    return {
        (pi, si): s.recompute
        for pi, p in enumerate(plan.pipelines)
        for si, s in enumerate(p.stages)
        if s.recompute != "none"
    }


def _check_degrees(plan: Plan, profile: ModelProfile, cluster: Cluster) -> None:
    """Every block of a tensor-parallel stage has its degree, with times for the stage's devices
    (each block, type and degree looked up once: the answer depends on nothing else, and a
    512-device plan holds each of them hundreds of times)."""
    passed: set[tuple[int, str, int]] = set()
    for pi, p in enumerate(plan.pipelines):
        for si, s in enumerate(p.stages):
            if s.tensor_parallel == 1:
                continue
            types = {cluster.device(address).type.name: cluster.device(address).type for address in s.devices}
            for b in range(s.start, s.end):
                for name, device_type in types.items():
                    key = (b, name, s.tensor_parallel)
                    if key in passed:
                        continue
                    try:
                        profile.block_time(b, device_type, 1, s.tensor_parallel)
                        passed.add(key)
                    except HetplanError as exc:
                        raise HetplanError(
                            f"{exc.reason} (profile {profile.file or 'in memory'})",
                            file=plan.file,
                            field=f"pipelines[{pi}].stages[{si}].tensor_parallel",
                        ) from None


def _critical_path(engine: Engine, folded: _FoldedNames | None = None) -> list[tuple[str, float]]:
    """Walk back from the last task along the predecessors that released each task last.

    Each task on the path is charged from its start until it released the next one: its end for
    a plain edge, its start + offset for an offset edge (an all-reduce released part-way through a
    backward charges the backward only up to the release). Every task starts the moment it is
    released, so the charges tile ``[0, iteration]`` and sum to the iteration time. ``folded``: the
    engine ran only some pipelines (:mod:`hetplan.simulate.replicas`); the path is named as the
    full simulation's.
    """
    if not len(engine):
        return []
    if folded is None:
        t = int(np.argmax(engine.end))  # the last task to end (the first such, on a tie)
        devices, pipelines = {}, {}
    else:
        t, devices, pipelines = folded.start(engine)
    until = engine.end[t]
    spent: dict[str, float] = {}
    while t >= 0:
        info: TaskInfo = engine.meta[t]
        if info.kind == "allreduce":  # a collective: the full path's stretch in a first replica ends
            devices, pipelines = {}, {}
        if info.kind in ("F", "B", "step"):
            what = f"compute on {devices.get(info.device, info.device)}"
        elif info.kind == "send":
            what = f"link {devices.get(info.device, info.device)} -> {devices.get(info.peer, info.peer)}"
        elif info.kind == "gather":
            what = f"boundary all-gather of pipeline {pipelines.get(info.pipeline, info.pipeline)} stage {info.stage}"
        else:
            what = f"{info.op or 'all-reduce'} of group {info.group}"
        lo = engine.start[t]
        spent[what] = spent.get(what, 0.0) + min(engine.end[t], until) - lo
        until = lo
        t = engine.binding[t]
    return sorted(spent.items(), key=lambda kv: (-kv[1], kv[0]))


class _FoldedNames:
    """Where the full simulation's critical path starts, as a task of a folded engine, and the names
    it goes by until the path reaches a collective (:mod:`hetplan.simulate.replicas`).

    The full run's path starts at the first task, in its numbering, of those that end last. Its
    numbering runs kind by kind (computes, boundary gathers, transfers, collectives, steps, ZeRO's
    gathers), pipeline by pipeline inside a kind; a representative's task stands for its
    counterparts, the first of which is its class's first pipeline's. From there the full path runs
    through that first pipeline as the representative's runs through its own (the same durations,
    the same order of events inside a pipeline) until it reaches a collective. Assumed, not proved:
    that no step's predecessor inside its pipeline ends at exactly the float its collective ends at
    (the two counterparts could then be released by different ones); random plans with whole-second
    and zero block times, built to tie, have not produced one (tests/simulate/test_replicas.py)."""

    def __init__(self, folding: Folding, compiled: CompiledPlan, tasks: _Tasks) -> None:
        self.folding = folding
        self.tasks = tasks
        self.pipeline_of_row = [p.pipeline for p in compiled.programs.values()]

    def _order(self, engine: Engine, t: int) -> tuple[int, int, int]:
        kind, row = self.tasks.kind[t], self.tasks.row[t]
        if kind == _AR:  # shared by every pipeline: numbered the same in both runs
            return (5 if engine.meta[t].op == _ZERO_GATHER else 3), -1, t
        rank = {_F: 0, _B: 0, _GATHER: 1, _SEND: 2, _STEP: 4}[kind]
        pipeline = self.pipeline_of_row[row]
        first = self.folding.first_of.get(pipeline, pipeline)
        return rank, first, t  # kept tasks of one kind and pipeline are numbered in full-run order

    def start(self, engine: Engine) -> tuple[int, dict[str, str], dict[int, int]]:
        """(the task, names of devices and pipelines to use until the path reaches a collective)."""
        end = np.asarray(engine.end)
        last = np.flatnonzero(end == end.max()).tolist()
        t = min(last, key=lambda x: self._order(engine, x))
        row = self.tasks.row[t]
        pipeline = self.pipeline_of_row[row] if row >= 0 and self.tasks.kind[t] != _AR else -1
        first = self.folding.first_of.get(pipeline)
        if first is None:
            return t, {}, {}
        return t, self.folding.first_device, {pipeline: first}


def _folded_tasks(folding: Folding, compiled: CompiledPlan, row: np.ndarray) -> int:
    """Tasks the pipelines folded away would have had in the engine: each its representative's own
    (computes, the transfers it sends, boundary gathers, steps; every task with a device row but a
    collective)."""
    pipeline_of_row = np.asarray([p.pipeline for p in compiled.programs.values()], dtype=np.int64)
    own = np.bincount(pipeline_of_row[row[row >= 0]], minlength=int(pipeline_of_row.max()) + 1)
    return int(sum(int(own[rep]) for rep in folding.pipeline_copy_of.values()))


def _timeline_rows(engine: Engine, compiled: CompiledPlan) -> list[tuple[str, str, float, float, str]]:
    rows = []
    for t in range(len(engine)):
        info: TaskInfo = engine.meta[t]
        lo, hi = engine.start[t], engine.end[t]
        if info.kind == "allreduce":
            label = str(info)
            rows.extend((address, info.kind, lo, hi, label) for address in compiled.groups[info.group].devices)
        elif info.kind == "gather":  # drawn as the transfer it completes, on every member
            rows.extend((address, "send", lo, hi, str(info)) for address in compiled.programs[info.device].tp_group)
        else:
            rows.append((info.device, info.kind, lo, hi, str(info)))
    return rows


def simulate(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    *,
    timeline: bool = False,
    compiled: CompiledPlan | None = None,
    memory: dict[str, MemoryUse] | None = None,
) -> SimResult:
    """Simulate one iteration of ``plan``; raises :class:`HetplanError` if it does not match its inputs.

    ``memory``: the plan's memory walk (``{address: result.devices[address].memory}`` of an earlier
    simulation) where the caller has it. The walk reads bytes and capacities only, never a time,
    a bandwidth or an overhead, so a caller that changes only those (calibration's fit, which
    simulates each measured plan hundreds of times) may keep it instead of walking again."""
    with gc_paused():
        check_plan(plan, cluster, profile)
        return _simulate(plan, profile, cluster, timeline=timeline, compiled=compiled, memory=memory)


def simulate_if_fits(plan: Plan, profile: ModelProfile, cluster: Cluster) -> SimResult | None:
    """:func:`simulate`, or None where a device runs out of memory: the memory walk needs only the
    compiled action lists, so it runs first and the event run only where every device fits (the
    walk is done once, not again for the result)."""
    walked = memory_if_fits(plan, profile, cluster)
    return simulate_walked(plan, profile, cluster, walked) if walked is not None else None


@dataclass(frozen=True)
class Walked:
    """A plan compiled and its memory walked, every device fitting: what :func:`simulate_walked`
    needs besides the plan (split from the event run so a caller can check many plans' memory and
    simulate only those it still wants)."""

    compiled: CompiledPlan  # copied pipelines without actions (``compiled.skipped``): for the event run only
    memory: dict[str, MemoryUse]
    folding: Folding | None = None  # the pipelines that run alike (hetplan.simulate.replicas)


def memory_if_fits(plan: Plan, profile: ModelProfile, cluster: Cluster) -> Walked | None:
    """The plan checked, compiled and its memory walked; None where a device runs out of memory."""
    with gc_paused():
        check_plan(plan, cluster, profile)
        if not _static_fits(plan, profile, cluster):
            return None
        # pipelines that run alike are compiled and walked once (hetplan.simulate.replicas)
        folding = fold_replicas(plan, cluster)
        copies = memory_copies(plan, folding)
        compiled = compile_plan(plan, len(profile.blocks), skip=uncompiled_pipelines(plan, folding))
        memory = plan_memory(
            compiled, profile, cluster, optimizer=plan.optimizer, dtype=plan.dtype, plan=plan, copies=copies
        )
        if not all(use.fits for use in memory.values()):
            return None
        return Walked(compiled, memory, folding)


def simulate_walked(plan: Plan, profile: ModelProfile, cluster: Cluster, walked: Walked) -> SimResult:
    """The event run of a plan :func:`memory_if_fits` accepted."""
    with gc_paused():
        return _simulate(
            plan,
            profile,
            cluster,
            timeline=False,
            compiled=walked.compiled,
            memory=walked.memory,
            folding=walked.folding,
        )


def _static_fits(plan: Plan, profile: ModelProfile, cluster: Cluster) -> bool:
    """False where some device cannot hold even its stage's weights, gradients and optimizer
    state (ZeRO-1's share of the state left out: at least nothing), which is part of what the
    memory walk counts (the rest is never negative), so the walk would not fit either: such a
    plan is refused without compiling it. True says nothing (the walk decides)."""
    dtype = plan.dtype or profile.dtype
    seen: set[tuple[int, int, int, str]] = set()
    for p in plan.pipelines:
        for s in p.stages:
            for address in s.devices:
                device_type = cluster.device(address).type
                key = (s.start, s.end, s.tensor_parallel, device_type.name)
                if key in seen:
                    continue
                seen.add(key)
                static = static_stage_bytes(
                    profile,
                    s.start,
                    s.end,
                    tp=s.tensor_parallel,
                    dtype=dtype,
                    optimizer=plan.optimizer,
                    sync=plan.sync,
                    zero=plan.zero,
                )
                # less a hair: the walk's activations may come out a few ulps below zero
                if not device_type.fits(static * (1 - 1e-9)):
                    return False
    return True


def _simulate(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    *,
    timeline: bool,
    compiled: CompiledPlan | None,
    memory: dict[str, MemoryUse] | None = None,
    folding: Folding | Literal["find"] | None = "find",
) -> SimResult:
    """The run behind :func:`simulate` (``plan`` already checked against its inputs); ``memory``:
    the plan's memory walk where the caller has it. Pipelines that run alike are run once
    (:mod:`hetplan.simulate.replicas`; ``folding``: ``fold_replicas(plan, cluster)`` where the
    caller has it), except for a timeline, which draws every task."""
    profile = whole_vocab_profile(plan, profile)  # vocab_parallel: false stages hold the vocabulary whole
    _check_degrees(plan, profile, cluster)  # (a block kept whole needs no figures at the degree)
    if timeline:
        folding = None
    elif isinstance(folding, str):
        folding = fold_replicas(plan, cluster)
    copies = memory_copies(plan, folding)
    copied = uncompiled_pipelines(plan, folding)
    if compiled is None or not compiled.skipped <= copied:  # a skipped pipeline must be a copy
        compiled = compile_plan(plan, len(profile.blocks), skip=copied)
    compiled = with_shared_groups(compiled, plan, profile.shared)
    costs = shared_cost_model(profile, cluster, plan.optimizer)
    engine, tasks, capacity = _build(compiled, costs, cluster, plan, folding.kept if folding is not None else None)
    iteration = engine.run(capacity)

    # per-device and per-stage sums, vectorised (bincount adds in task order, as a loop would)
    n_dev = len(compiled.programs)
    start, end = np.asarray(engine.start), np.asarray(engine.end)
    spent = end - start
    kind, row, peer = np.asarray(tasks.kind), np.asarray(tasks.row), np.asarray(tasks.peer)

    def per_device(mask: np.ndarray) -> list[float]:
        return np.bincount(row[mask], weights=spent[mask], minlength=n_dev).tolist()

    is_f, is_b, is_send, is_step = kind == _F, kind == _B, kind == _SEND, kind == _STEP
    compute_s = per_device(is_f | is_b)
    fwd_s, bwd_s, step_s = per_device(is_f), per_device(is_b), per_device(is_step)
    stage_of = [(p.pipeline, p.stage) for p in compiled.programs.values()]
    stage_id = {key: i for i, key in enumerate(dict.fromkeys(stage_of))}
    device_stage = np.asarray([stage_id[key] for key in stage_of], dtype=np.int64)
    send_by_stage = np.bincount(device_stage[row[is_send]], weights=spent[is_send], minlength=len(stage_id)).tolist()

    if plan.sync == "sdpipe":
        # pipelines meet only to average weights: each runs at its own pace, so the job's rate is the
        # sum of theirs, and its iteration the time that rate takes for one global batch
        pipeline_of = np.asarray([p.pipeline for p in compiled.programs.values()], dtype=np.int64)
        ends = np.zeros(len(plan.pipelines))
        np.maximum.at(ends, pipeline_of[row[is_step]], end[is_step])
        # Python floats (tolist): a numpy scalar here reached the plan file, which YAML cannot write
        rate = sum(p.batch / t for p, t in zip(plan.pipelines, ends.tolist(), strict=True) if t > 0)
        iteration = plan.global_batch / rate if rate > 0 else iteration
    busy_mask = is_f | is_b | is_step
    busy = _union_lengths(row[busy_mask], start[busy_mask], end[busy_mask], n_dev)
    index = {a: i for i, a in enumerate(compiled.programs)}
    ar_rows, ar_lo, ar_hi = [], [], []  # an all-reduce keeps every device of its group communicating
    for t in np.flatnonzero(kind == _AR).tolist():
        for address in compiled.groups[tasks.peer[t]].devices:
            if folding is not None and address not in folding.kept:
                continue  # a copied device's figures are its representative's (below)
            ar_rows.append(index[address])
            ar_lo.append(engine.start[t])
            ar_hi.append(engine.end[t])
    comm = _union_lengths(
        np.concatenate([row[is_send], peer[is_send], np.asarray(ar_rows, dtype=row.dtype)]),
        np.concatenate([start[is_send], start[is_send], np.asarray(ar_lo, dtype=float)]),
        np.concatenate([end[is_send], end[is_send], np.asarray(ar_hi, dtype=float)]),
        n_dev,
    )

    n_tasks = len(engine)
    if folding is not None:  # the folded-away devices' figures are their representatives'
        for address, copy in folding.copy_of.items():
            i, j = index[address], index[copy]
            for figures in (compute_s, fwd_s, bwd_s, step_s, busy, comm):
                figures[i] = figures[j]
        for (pi, si), k in stage_id.items():
            if pi in folding.pipeline_copy_of:
                send_by_stage[k] = send_by_stage[stage_id[(folding.pipeline_copy_of[pi], si)]]
        n_tasks += _folded_tasks(folding, compiled, row)

    devices: dict[str, DeviceStats] = {}
    total_compute = 0.0
    memory_of = memory or plan_memory(
        compiled, profile, cluster, optimizer=plan.optimizer, dtype=plan.dtype, plan=plan, copies=copies
    )
    for i, (address, program) in enumerate(compiled.programs.items()):
        device = cluster.device(address)
        memory = memory_of[address]
        devices[address] = DeviceStats(
            address=address,
            type=device.type.name,
            pipeline=program.pipeline,
            stage=program.stage,
            compute_s=compute_s[i],
            optimizer_s=step_s[i],
            comm_s=comm[i],
            idle_s=max(0.0, iteration - busy[i]),
            memory=memory,
        )
        total_compute += compute_s[i]
    bubble = 1.0 - total_compute / (iteration * len(devices)) if iteration > 0 else 0.0

    stages = []
    for pi, p in enumerate(plan.pipelines):
        for si, s in enumerate(p.stages):
            stages.append(
                StageStats(
                    pipeline=pi,
                    stage=si,
                    blocks=(s.start, s.end),
                    devices=s.devices,
                    fwd_s=max(fwd_s[index[d]] for d in s.devices),
                    bwd_s=max(bwd_s[index[d]] for d in s.devices),
                    send_s=send_by_stage[stage_id[(pi, si)]] if (pi, si) in stage_id else 0.0,
                )
            )
    path = _critical_path(engine, _FoldedNames(folding, compiled, tasks) if folding is not None else None)
    return SimResult(
        iteration_s=iteration,
        global_batch=plan.global_batch,
        bubble_fraction=max(0.0, bubble),
        devices=devices,
        stages=stages,
        critical_path=path,
        bottleneck=path[0][0] if path else "",
        timeline=_timeline_rows(engine, compiled) if timeline else [],
        n_tasks=n_tasks,
        central=central_memory(plan, profile, cluster, optimizer=plan.optimizer),
    )


def check_memory(result: SimResult, plan: Plan) -> None:
    """Raise a one-line error naming the pipeline, stage and device of the first stage that does not fit."""
    for address, d in result.devices.items():
        if not d.memory.fits:
            from hetplan.units import format_bytes

            m = d.memory
            raise HetplanError(
                f"pipeline {d.pipeline} stage {d.stage} does not fit on {address} ({d.type}): needs "
                f"{format_bytes(m.total)} (weights {format_bytes(m.weights)}, gradients {format_bytes(m.gradients)}, "
                f"optimizer {format_bytes(m.optimizer)}, activations of {m.peak_micro_batches} micro-batches "
                f"and buffers {format_bytes(m.activations)}, fragmentation {m.fragmentation:.0%}, reserve "
                f"{format_bytes(m.reserve)}) of {format_bytes(m.capacity)}; "
                "use smaller micro-batches, more stages, or a lighter optimizer",
                file=plan.file,
                field=f"pipelines[{d.pipeline}].stages[{d.stage}]",
            )

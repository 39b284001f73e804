"""Simulate one training iteration of a plan: the ground truth for every predicted figure.

    result = simulate(plan, profile, cluster)
    result.iteration_s, result.samples_per_s, result.bubble_fraction
    result.devices["node0/0"].memory.fits
    result.critical_path            # [(what, seconds on the path), ...] longest first

The plan compiles to per-device action lists (:mod:`planner.schedule`); each action becomes a task
of a discrete-event run (:mod:`planner.simulate.engine`): forwards and backwards on their device in
list order, activation and gradient transfers on the link between their two devices (inter-node
transfers share each node's network link), one all-reduce per gradient group released part-way
through each holder's last backward (when that group's blocks are done), then the optimizer step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from planner.contracts.cluster import Cluster
from planner.contracts.model_profile import ModelProfile
from planner.contracts.plan import Plan, check_plan
from planner.errors import HetplanError
from planner.schedule.actions import Kind
from planner.schedule.compile import CompiledPlan, compile_plan
from planner.simulate.costs import CostModel
from planner.simulate.engine import Engine
from planner.simulate.memory import MemoryUse, device_memory

__all__ = ["DeviceStats", "SimResult", "StageStats", "check_memory", "simulate"]


class TaskInfo(NamedTuple):
    """What a task of the engine stands for (for the timeline, the critical path and errors)."""

    kind: str  # "F", "B", "send", "allreduce", "step"
    device: str  # the device row it is drawn on (the sender for a transfer)
    pipeline: int
    stage: int
    micro: int = -1
    peer: str = ""
    group: int = -1

    def __str__(self) -> str:
        where = f"pipeline {self.pipeline} stage {self.stage} on {self.device}"
        if self.kind in ("F", "B"):
            return f"{self.kind}{self.micro} of {where}"
        if self.kind == "send":
            return f"transfer of micro-batch {self.micro} {self.device} -> {self.peer}"
        if self.kind == "allreduce":
            return f"all-reduce of gradient group {self.group}"
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
    send_s: float  # activation transfers out of this stage, summed


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
                    "capacity_bytes": round(d.memory.capacity),
                    "fits": d.memory.fits,
                }
                for a, d in self.devices.items()
            },
        }

    def to_json(self) -> dict[str, Any]:
        return {
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
                    "memory_fits": d.memory.fits,
                }
                for a, d in self.devices.items()
            },
            "stages": [s.__dict__ | {"blocks": list(s.blocks), "devices": list(s.devices)} for s in self.stages],
        }


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_lo, cur_hi = 0.0, None, None
    for lo, hi in sorted(intervals):
        if cur_hi is None or lo > cur_hi:
            if cur_hi is not None:
                total += cur_hi - cur_lo
            cur_lo, cur_hi = lo, hi
        else:
            cur_hi = max(cur_hi, hi)
    if cur_hi is not None:
        total += cur_hi - cur_lo
    return total


def _build(compiled: CompiledPlan, costs: CostModel, cluster: Cluster) -> tuple[Engine, dict, dict]:
    """Tasks and edges for one iteration; returns the engine, compute-task ids and resource capacities."""
    engine = Engine()
    compute_task: dict[tuple[str, bool, int], int] = {}  # (device, backward?, micro)
    last_compute: dict[str, int] = {}
    last_backward: dict[str, int] = {}
    forward, backward_kind = Kind.FORWARD, Kind.BACKWARD
    add_fixed, add_edge = engine.add_fixed, engine.add_edge
    for address, program in compiled.programs.items():
        device = cluster.device(address)
        prev = -1
        pipeline, stage, start, end = program.pipeline, program.stage, program.start, program.end
        for action in program.actions:
            kind = action.kind
            if kind is not forward and kind is not backward_kind:
                continue
            backward = kind is backward_kind
            seconds = costs.compute(device, start, end, action.hi - action.lo, backward=backward)
            t = add_fixed(seconds, TaskInfo(kind.value, address, pipeline, stage, action.micro))
            compute_task[(address, backward, action.micro)] = t
            if prev >= 0:
                add_edge(prev, t)
            prev = t
            if backward:
                last_backward[address] = t
        last_compute[address] = prev

    capacity: dict[Any, float] = {}
    for node in cluster.nodes:
        capacity[("out", node.name)] = node.nic_bandwidth
        capacity[("in", node.name)] = node.nic_bandwidth
    links: dict[tuple[str, str], Any] = {}
    for tr in compiled.transfers:
        src, dst = cluster.device(tr.src), cluster.device(tr.dst)
        program = compiled.programs[tr.dst if tr.grad else tr.src]
        nbytes = costs.boundary_bytes(program.end, tr.samples)
        link = links.get((src.node, dst.node))
        if link is None:
            link = links[(src.node, dst.node)] = cluster.link(src, dst)
        info = TaskInfo("send", tr.src, tr.pipeline, tr.stage + (1 if tr.grad else 0), tr.micro, tr.dst)
        if link.shared:
            t = engine.add_flow(
                nbytes,
                latency=link.latency,
                cap=link.bandwidth,
                resources=(("out", src.node), ("in", dst.node)),
                meta=info,
            )
        else:
            t = engine.add_fixed(link.transfer_time(nbytes), info)
        engine.add_edge(compute_task[(tr.src, tr.grad, tr.micro)], t)
        engine.add_edge(t, compute_task[(tr.dst, tr.grad, tr.micro)])

    done_comm: dict[str, list[int]] = {a: [] for a in compiled.programs}
    last_comm: dict[str, int] = {}
    for group in compiled.groups:
        if len(group.devices) <= 1:
            continue
        devices = [cluster.device(a) for a in group.devices]
        seconds = costs.allreduce(costs.gradient_bytes(group.blocks), devices)
        t = engine.add_fixed(seconds, TaskInfo("allreduce", group.devices[0], -1, -1, group=group.id))
        for address in group.devices:
            program = compiled.programs[address]
            if address in last_backward:
                last_b = last_backward[address]
                lowest = min(b for b in group.blocks if program.start <= b < program.end)
                samples = program.counts[max(j for j, c in enumerate(program.counts) if c > 0)]
                per_block = costs.block_times(cluster.device(address), samples, backward=True)
                engine.add_edge(last_b, t, offset=sum(per_block[lowest : program.end]))
            if address in last_comm:
                engine.add_edge(last_comm[address], t)
            last_comm[address] = t
            done_comm[address].append(t)

    for address, program in compiled.programs.items():
        device = cluster.device(address)
        info = TaskInfo("step", address, program.pipeline, program.stage)
        t = engine.add_fixed(costs.optimizer_step(device, program.start, program.end), info)
        if last_compute[address] >= 0:
            engine.add_edge(last_compute[address], t)
        for c in done_comm[address]:
            engine.add_edge(c, t)
    return engine, compute_task, capacity


def _critical_path(engine: Engine) -> list[tuple[str, float]]:
    """Walk back from the last task along the predecessors that released each task last."""
    t = max(range(len(engine)), key=lambda i: (engine.end[i], -i))
    spent: dict[str, float] = {}
    while t >= 0:
        info: TaskInfo = engine.meta[t]
        if info.kind in ("F", "B", "step"):
            what = f"compute on {info.device}"
        elif info.kind == "send":
            what = f"link {info.device} -> {info.peer}"
        else:
            what = f"all-reduce of group {info.group}"
        spent[what] = spent.get(what, 0.0) + engine.end[t] - engine.start[t]
        t = engine.binding[t]
    return sorted(spent.items(), key=lambda kv: (-kv[1], kv[0]))


def simulate(
    plan: Plan, profile: ModelProfile, cluster: Cluster, *, timeline: bool = False, compiled: CompiledPlan | None = None
) -> SimResult:
    """Simulate one iteration of ``plan``; raises :class:`HetplanError` if it does not match its inputs."""
    check_plan(plan, cluster, profile)
    compiled = compiled or compile_plan(plan, len(profile.blocks))
    costs = CostModel(profile, cluster, optimizer=plan.optimizer)
    engine, _, capacity = _build(compiled, costs, cluster)
    iteration = engine.run(capacity)

    busy: dict[str, list[tuple[float, float]]] = {a: [] for a in compiled.programs}
    comm: dict[str, list[tuple[float, float]]] = {a: [] for a in compiled.programs}
    compute_s = dict.fromkeys(compiled.programs, 0.0)
    step_s = dict.fromkeys(compiled.programs, 0.0)
    stage_fwd: dict[tuple[int, int, str], float] = {}
    stage_bwd: dict[tuple[int, int, str], float] = {}
    stage_send: dict[tuple[int, int], float] = {}
    rows = []
    for t in range(len(engine)):
        info: TaskInfo = engine.meta[t]
        lo, hi = engine.start[t], engine.end[t]
        if info.kind in ("F", "B"):
            busy[info.device].append((lo, hi))
            compute_s[info.device] += hi - lo
            table = stage_fwd if info.kind == "F" else stage_bwd
            key = (info.pipeline, info.stage, info.device)
            table[key] = table.get(key, 0.0) + hi - lo
        elif info.kind == "step":
            busy[info.device].append((lo, hi))
            step_s[info.device] += hi - lo
        elif info.kind == "send":
            comm[info.device].append((lo, hi))
            comm[info.peer].append((lo, hi))
            if info.micro >= 0:
                key2 = (info.pipeline, info.stage)
                stage_send[key2] = stage_send.get(key2, 0.0) + hi - lo
        else:
            group = compiled.groups[info.group]
            for address in group.devices:
                comm[address].append((lo, hi))
                if timeline:
                    rows.append((address, info.kind, lo, hi, str(info)))
            continue
        if timeline:
            rows.append((info.device, info.kind, lo, hi, str(info)))

    devices: dict[str, DeviceStats] = {}
    total_compute = 0.0
    for address, program in compiled.programs.items():
        device = cluster.device(address)
        memory = device_memory(program, profile, optimizer=plan.optimizer, capacity=device.type.memory)
        devices[address] = DeviceStats(
            address=address,
            type=device.type.name,
            pipeline=program.pipeline,
            stage=program.stage,
            compute_s=compute_s[address],
            optimizer_s=step_s[address],
            comm_s=_union_length(comm[address]),
            idle_s=max(0.0, iteration - _union_length(busy[address])),
            memory=memory,
        )
        total_compute += compute_s[address]
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
                    fwd_s=max(stage_fwd.get((pi, si, d), 0.0) for d in s.devices),
                    bwd_s=max(stage_bwd.get((pi, si, d), 0.0) for d in s.devices),
                    send_s=stage_send.get((pi, si), 0.0),
                )
            )
    path = _critical_path(engine)
    return SimResult(
        iteration_s=iteration,
        global_batch=plan.global_batch,
        bubble_fraction=max(0.0, bubble),
        devices=devices,
        stages=stages,
        critical_path=path,
        bottleneck=path[0][0] if path else "",
        timeline=rows,
        n_tasks=len(engine),
    )


def check_memory(result: SimResult, plan: Plan) -> None:
    """Raise a one-line error naming the pipeline, stage and device of the first stage that does not fit."""
    for address, d in result.devices.items():
        if not d.memory.fits:
            from planner.units import format_bytes

            m = d.memory
            raise HetplanError(
                f"pipeline {d.pipeline} stage {d.stage} does not fit on {address} ({d.type}): needs "
                f"{format_bytes(m.total)} (weights {format_bytes(m.weights)}, gradients {format_bytes(m.gradients)}, "
                f"optimizer {format_bytes(m.optimizer)}, activations of {m.peak_micro_batches} micro-batches "
                f"{format_bytes(m.activations)}, reserve {format_bytes(m.reserve)}) of {format_bytes(m.capacity)}; "
                "use smaller micro-batches, more stages, or a lighter optimizer",
                file=plan.file,
                field=f"pipelines[{d.pipeline}].stages[{d.stage}]",
            )

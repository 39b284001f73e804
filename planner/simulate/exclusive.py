"""Run a task graph on devices shared by several jobs: one compute at a time per device.

    run = run_exclusive(engine, capacity, Sharing(compute=..., collective=..., job=..., ends_turn=...),
                        policy="crossover")
    run.start[t], run.end[t], run.waited[t]

A single job needs no such rule: its compute on a device is one chain of edges (its action list), so
:meth:`hetplan.simulate.engine.Engine.run` never finds two of its tasks on one device at once. Two
jobs on the same GPUs have two chains per device, and which goes next is a decision made while the
run unfolds (who is ready depends on the other's communication), not an edge that could be added
before. This is that event loop: :meth:`Engine.run`'s events, float operations and tie-breaking,
plus three rules:

* a **compute task** (forward, backward, optimizer step) needs its device; released while the device
  computes, or while a decision on it is pending, it waits there;
* when a compute task on a device several jobs use ends, the device's next task is **decided by the
  policy** among the tasks waiting once the tasks that ending released have arrived (an event at the
  same instant, after them): ``first-come`` takes the one released first; ``crossover`` lets the job
  that just computed keep the device while its next compute is ready (its *turn*), and hands the
  device to the next job with compute waiting when the job has none ready (it waits on communication:
  the other computes meanwhile, the alternation of CrossoverScheduler) or has just run its optimizer
  step (so a job with nothing to wait for cannot hold the device for more than one iteration);
* a **collective** (a gradient group's all-reduce, reduce-scatter or all-gather) holds a slot on each
  of its devices: collectives of different jobs that share a device run one after the other, first
  released first, a later one starting early where its devices are free. (Inside one job a device's
  collectives are a chain already, as one communicator runs one collective at a time.)

A graph whose devices each serve one job runs exactly as :meth:`Engine.run` runs it: the same start
and end for every task (``tests/simulate/test_together_sim.py`` checks it).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetplan.errors import HetplanError
from hetplan.simulate.engine import Engine

__all__ = ["POLICIES", "RUNTIME_POLICIES", "ExclusiveRun", "Sharing", "run_exclusive"]

#: The orders between jobs on a shared device (module docstring).
POLICIES = ("crossover", "first-come")

#: The policies ``hetplan launch A B`` really runs (its per-device turn, hetplan.runtime.processes.crossover):
#: first-come only. ``crossover`` stays a simulated what-if: a runtime version of it starved a
#: pipeline job beside a data-parallel one (docs/co-scheduling.md), so co-plan does not try it unless
#: asked and never prefers it on a tie.
RUNTIME_POLICIES = ("first-come",)

_READY, _DONE, _DRAINED, _OFFSET, _DECIDE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class Sharing:
    """What each task of the graph holds while it runs, and whose it is (lists parallel to the tasks)."""

    compute: Sequence[int]  # the device whose compute the task needs; -1: none (transfers, collectives)
    collective: Sequence[tuple[int, ...]]  # the devices a collective holds a slot on; () for other tasks
    job: Sequence[int]  # the job the task belongs to (0, 1, ...)
    ends_turn: Sequence[bool]  # a compute task after which a crossover turn ends (the optimizer step)
    n_devices: int
    n_jobs: int


@dataclass
class ExclusiveRun:
    """Start, end and the time spent waiting for a busy device or collective slot, per task."""

    start: list[float]
    end: list[float]
    waited: list[float]
    makespan: float


def _shared_devices(sharing: Sharing) -> list[bool]:
    """Devices on which more than one job computes: only there is anything decided."""
    first = [-1] * sharing.n_devices
    shared = [False] * sharing.n_devices
    for device, job in zip(sharing.compute, sharing.job, strict=True):
        if device >= 0:
            if first[device] < 0:
                first[device] = job
            elif first[device] != job:
                shared[device] = True
    return shared


def run_exclusive(engine: Engine, capacity: dict[Any, float], sharing: Sharing, policy: str) -> ExclusiveRun:
    """Run ``engine``'s graph with exclusive devices and collective slots; a cycle is an error."""
    if policy not in POLICIES:
        raise HetplanError(f"unknown policy {policy!r}; expected one of {', '.join(POLICIES)}", field="--policy")
    n = len(engine)
    npred = list(engine.npred)
    nan = float("nan")
    start, end, released = [nan] * n, [nan] * n, [nan] * n
    duration, flows, meta = engine.duration, engine.flow, engine.meta
    plain: list[list[int]] = []  # successors released when the task ends, in the engine's order
    offsets: dict[int, list[tuple[int, float]]] = {}  # ... and at its start plus an offset
    for t, edges in enumerate(engine.succ):
        plain.append([b for b, off in edges if off is None])
        if len(edges) > len(plain[-1]):
            offsets[t] = [(b, off) for b, off in edges if off is not None]
    compute, collective, job_of, ends_turn = sharing.compute, sharing.collective, sharing.job, sharing.ends_turn
    shared = _shared_devices(sharing)
    crossover = policy == "crossover"

    # resources of the network flows, exactly as Engine.run keeps them
    res_id: dict[Any, int] = {}
    res_cap: list[float] = []
    flow_res: dict[int, tuple[int, ...]] = {}
    for t, flow in enumerate(flows):
        if flow is not None:
            ids = []
            for r in flow[3]:
                i = res_id.get(r)
                if i is None:
                    i = res_id[r] = len(res_cap)
                    res_cap.append(capacity.get(r, -1.0))
                ids.append(i)
            flow_res[t] = tuple(ids)
    on_resource: list[set[int]] = [set() for _ in res_cap]
    share = [0.0] * len(res_cap)
    active: set[int] = set()
    remaining, rate, updated, version = [0.0] * n, [0.0] * n, [0.0] * n, [0] * n

    busy = [False] * sharing.n_devices  # the device computes
    deciding = [False] * sharing.n_devices  # a decision on the device is due at this instant
    waiting: list[list[int]] = [[] for _ in range(sharing.n_devices)]  # released, in order of release
    holder = [-1] * sharing.n_devices  # the job that computed last on the device
    turn_over = [False] * sharing.n_devices  # its last task ended its turn
    slot_busy = [False] * sharing.n_devices  # a collective holds the device's slot
    slot_waiting: list[int] = []  # collectives released while a device of theirs was held

    heap: list[tuple[float, int, int, int, int]] = [(0.0, t, _READY, t, -1) for t in range(n) if npred[t] == 0]
    heapq.heapify(heap)
    seq = n
    push, pop = heapq.heappush, heapq.heappop

    def reshare(now: float, resources: tuple[int, ...]) -> None:
        nonlocal seq
        for r in resources:
            if on_resource[r] and res_cap[r] >= 0.0:
                share[r] = res_cap[r] / len(on_resource[r])
        if len(resources) == 2:
            touched = sorted(on_resource[resources[0]] | on_resource[resources[1]])
        else:
            touched = sorted(set().union(*[on_resource[r] for r in resources]))
        for f in touched:
            left = remaining[f] - rate[f] * (now - updated[f])
            remaining[f] = left
            updated[f] = now
            r_f = cap = flows[f][2]
            for r in flow_res[f]:
                s = share[r] if res_cap[r] >= 0.0 else cap / len(on_resource[r])
                if s < r_f:
                    r_f = s
            rate[f] = r_f
            version[f] += 1
            push(heap, (now + (left if left > 0.0 else 0.0) / r_f, seq, _DRAINED, f, version[f]))
            seq += 1

    def begin(t: int, now: float) -> None:
        """What Engine.run does when a task is released: start it."""
        nonlocal seq
        start[t] = now
        offs = offsets.get(t)
        if offs is not None:
            for b, offset in offs:
                push(heap, (now + offset, seq, _OFFSET, t, b))
                seq += 1
        flow = flows[t]
        if flow is None:
            push(heap, (now + duration[t], seq, _DONE, t, -1))
            seq += 1
        else:
            resources = flow_res[t]
            for r in resources:
                on_resource[r].add(t)
            active.add(t)
            remaining[t] = flow[0]
            rate[t] = 0.0
            updated[t] = now
            reshare(now, resources)

    def choose(device: int) -> int:
        """The waiting task the policy gives ``device`` next."""
        queue = waiting[device]
        if not crossover:
            return queue[0]  # released first (ties: in the order released)
        first_of: dict[int, int] = {}
        for t in queue:
            first_of.setdefault(job_of[t], t)
        h = holder[device]
        if h in first_of and not turn_over[device]:
            return first_of[h]  # the turn goes on: its next compute is ready
        for k in range(1, sharing.n_jobs + 1):
            j = (h + k) % sharing.n_jobs
            if j in first_of:
                return first_of[j]
        return queue[0]  # unreachable: the queue is not empty

    def start_slots(now: float) -> None:
        """Start every waiting collective whose devices are all free, first released first."""
        still: list[int] = []
        for c in slot_waiting:
            if any(slot_busy[d] for d in collective[c]):
                still.append(c)
                continue
            for d in collective[c]:
                slot_busy[d] = True
            begin(c, now)
        slot_waiting[:] = still

    finished = 0
    while heap:
        now, _, kind, t, other = pop(heap)
        if kind == _DONE:
            end[t] = now
            finished += 1
            for b in plain[t]:
                npred[b] -= 1
                if npred[b] == 0:
                    push(heap, (now, seq, _READY, b, -1))
                    seq += 1
            device = compute[t]
            if device >= 0:
                busy[device] = False
                turn_over[device] = ends_turn[t]
                if shared[device]:  # decide after the tasks just released have arrived
                    deciding[device] = True
                    push(heap, (now, seq, _DECIDE, device, -1))
                    seq += 1
            if collective[t]:
                for d in collective[t]:
                    slot_busy[d] = False
                if slot_waiting:
                    start_slots(now)
        elif kind == _READY:
            released[t] = now
            device = compute[t]
            if device >= 0:
                if busy[device] or deciding[device]:
                    waiting[device].append(t)
                    continue
                busy[device] = True
                holder[device] = job_of[t]
            members = collective[t]
            if members:
                if any(slot_busy[d] for d in members):
                    slot_waiting.append(t)
                    continue
                for d in members:
                    slot_busy[d] = True
            begin(t, now)
        elif kind == _DECIDE:
            device = t
            deciding[device] = False
            if busy[device] or not waiting[device]:
                continue
            chosen = choose(device)
            waiting[device].remove(chosen)
            busy[device] = True
            holder[device] = job_of[chosen]
            begin(chosen, now)
        elif kind == _DRAINED:
            if t not in active or version[t] != other:
                continue
            active.discard(t)
            resources = flow_res[t]
            for r in resources:
                on_resource[r].discard(t)
            reshare(now, resources)
            push(heap, (now + flows[t][1], seq, _DONE, t, -1))
            seq += 1
        else:  # _OFFSET
            npred[other] -= 1
            if npred[other] == 0:
                push(heap, (now, seq, _READY, other, -1))
                seq += 1
    if finished < n:
        stuck = next(t for t in range(n) if end[t] != end[t])
        raise HetplanError(f"the co-schedule deadlocks: {meta[stuck]} never runs (a cycle in its dependencies)")
    waited = [s - r for s, r in zip(start, released, strict=True)]
    return ExclusiveRun(start=start, end=end, waited=waited, makespan=max(end, default=0.0))

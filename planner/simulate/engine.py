"""A discrete-event engine over a task graph, with bandwidth shared on network links.

    engine = Engine()
    a = engine.add_fixed(0.002, meta)                 # a compute task: 2 ms
    t = engine.add_flow(1e6, latency=1e-5, cap=12.5e9, resources=(("out", "n0"), ("in", "n1")), meta=...)
    engine.add_edge(a, t)                              # t starts when a ends
    engine.add_edge(t, b, offset=None)
    engine.run(capacity={("out", "n0"): 12.5e9, ...})
    engine.start[t], engine.end[t]

A task starts as soon as every predecessor has finished (device order is expressed as edges, so a
device never runs two compute tasks at once). An edge may instead release its successor at a fixed
offset after the predecessor *starts* (a gradient bucket is ready part-way through a backward).
Flows are the only tasks whose duration is not known in advance: every active flow gets
``min(own cap, capacity(r) / flows on r)`` over the resources it uses (a node's network link out
and in), recomputed whenever a flow starts or ends; its latency is added after its bytes drain.
"""

from __future__ import annotations

import heapq
from typing import Any

from planner.errors import HetplanError

__all__ = ["Engine"]

_READY, _DONE, _DRAINED, _OFFSET = 0, 1, 2, 3


class Engine:
    """Tasks, edges and the run that gives each task its start and end."""

    def __init__(self) -> None:
        self.duration: list[float] = []
        self.flow: list[tuple[float, float, float, tuple] | None] = []
        self.meta: list[Any] = []
        self.succ: list[list[tuple[int, float | None]]] = []
        self.npred: list[int] = []
        self.start: list[float] = []
        self.end: list[float] = []
        self.binding: list[int] = []  # the predecessor that released each task last (-1: none)

    def _add(self, duration: float, flow: tuple | None, meta: Any) -> int:
        self.duration.append(duration)
        self.flow.append(flow)
        self.meta.append(meta)
        self.succ.append([])
        self.npred.append(0)
        return len(self.duration) - 1

    def add_fixed(self, duration: float, meta: Any = None) -> int:
        """A task of known duration (compute, an intra-node transfer, a collective, a step)."""
        return self._add(duration if duration > 0.0 else 0.0, None, meta)

    def add_flow(self, nbytes: float, *, latency: float, cap: float, resources: tuple, meta: Any = None) -> int:
        """A transfer that shares ``resources`` with the other flows active at the same time."""
        return self._add(0.0, (float(nbytes), float(latency), float(cap), resources), meta)

    def add_edge(self, a: int, b: int, *, offset: float | None = None) -> None:
        """``b`` waits for ``a`` to end (or, with ``offset``, for ``a`` to start plus ``offset``)."""
        self.succ[a].append((b, offset))
        self.npred[b] += 1

    def __len__(self) -> int:
        return len(self.duration)

    def run(self, capacity: dict[Any, float]) -> float:
        """Simulate; return the time the last task ends. A cycle (deadlock) is an error."""
        n = len(self.duration)
        npred = list(self.npred)
        self.start = [float("nan")] * n
        self.end = [float("nan")] * n
        self.binding = [-1] * n
        # events: (time, seq, kind, task, successor-for-offset-edges)
        heap: list[tuple[float, int, int, int, int]] = [(0.0, t, _READY, t, -1) for t in range(n) if npred[t] == 0]
        heapq.heapify(heap)
        seq = n
        active: dict[int, list[float]] = {}  # flow -> [remaining bytes, rate, last update, version]
        on_resource: dict[Any, set[int]] = {}
        version = [0] * n

        def push(time: float, kind: int, task: int, other: int = -1) -> None:
            nonlocal seq
            heapq.heappush(heap, (time, seq, kind, task, other))
            seq += 1

        def reshare(now: float, resources: tuple) -> None:
            """New rates for the flows that share a resource with one that started or ended."""
            touched = sorted({f for r in resources for f in on_resource[r]})
            for t in touched:
                state = active[t]
                state[0] -= state[1] * (now - state[2])
                state[2] = now
                _, _, cap, own = self.flow[t]
                rate = cap
                for r in own:
                    share = capacity.get(r, cap) / len(on_resource[r])
                    if share < rate:
                        rate = share
                state[1] = rate
                version[t] += 1
                push(now + max(state[0], 0.0) / rate, _DRAINED, t, version[t])

        def release(b: int, now: float, by: int) -> None:
            npred[b] -= 1
            if npred[b] == 0:
                self.binding[b] = by
                push(now, _READY, b)

        finished = 0
        while heap:
            now, _, kind, t, other = heapq.heappop(heap)
            if kind == _READY:
                self.start[t] = now
                for b, offset in self.succ[t]:
                    if offset is not None:
                        push(now + offset, _OFFSET, t, b)
                flow = self.flow[t]
                if flow is None:
                    push(now + self.duration[t], _DONE, t)
                else:
                    for r in flow[3]:
                        on_resource.setdefault(r, set()).add(t)
                    active[t] = [flow[0], 0.0, now, 0]
                    reshare(now, flow[3])
            elif kind == _DRAINED:
                if t not in active or version[t] != other:
                    continue  # stale: the flow's rate changed after this completion was projected
                del active[t]
                resources = self.flow[t][3]
                for r in resources:
                    on_resource[r].discard(t)
                reshare(now, resources)
                push(now + self.flow[t][1], _DONE, t)
            elif kind == _OFFSET:
                release(other, now, t)
            else:
                self.end[t] = now
                finished += 1
                for b, offset in self.succ[t]:
                    if offset is None:
                        npred[b] -= 1
                        if npred[b] == 0:  # release(b, now, t), inlined: this is the hot path
                            self.binding[b] = t
                            heapq.heappush(heap, (now, seq, _READY, b, -1))
                            seq += 1
        if finished < n:
            stuck = next(t for t in range(n) if self.end[t] != self.end[t])
            raise HetplanError(f"the schedule deadlocks: {self.meta[stuck]} never runs (a cycle in its dependencies)")
        return max(self.end, default=0.0)

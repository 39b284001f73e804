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

Events are processed in (time, order pushed): ties resolve first-come first-served, so a run is
deterministic, and :attr:`Engine.binding` (the predecessor that released each task last) gives the
critical path. Plain edges and offset edges are stored apart (most edges are plain; a plain edge
costs one int), :attr:`Engine.succ` shows both as ``(successor, offset or None)``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from typing import Any

from hetplan.errors import HetplanError

__all__ = ["Engine"]

_READY, _DONE, _DRAINED, _OFFSET = 0, 1, 2, 3


class Engine:
    """Tasks, edges and the run that gives each task its start and end."""

    def __init__(self) -> None:
        self.duration: list[float] = []
        self.flow: list[tuple[float, float, float, tuple] | None] = []
        self.meta: list[Any] = []
        self.next: list[list[int]] = []  # plain successors: released when the task ends
        self.offset_next: dict[int, list[tuple[int, float]]] = {}  # released at start + offset
        self.npred: list[int] = []
        self.start: list[float] = []
        self.end: list[float] = []
        self.binding: list[int] = []  # the predecessor that released each task last (-1: none)

    def _add(self, duration: float, flow: tuple | None, meta: Any) -> int:
        self.duration.append(duration)
        self.flow.append(flow)
        self.meta.append(meta)
        self.next.append([])
        self.npred.append(0)
        return len(self.duration) - 1

    def add_fixed(self, duration: float, meta: Any = None) -> int:
        """A task of known duration (compute, an intra-node transfer, a collective, a step)."""
        return self._add(duration if duration > 0.0 else 0.0, None, meta)

    def add_fixed_many(self, durations: Sequence[float], metas: Sequence[Any], *, chain: bool = False) -> range:
        """Many tasks of known duration at once (as :meth:`add_fixed` on each, in order); with
        ``chain``, each waits for the one before it (a device's compute order)."""
        first = len(self.duration)
        n = len(durations)
        if n and min(durations) > 0.0:
            self.duration.extend(durations)
        else:
            self.duration.extend([d if d > 0.0 else 0.0 for d in durations])
        self.flow.extend([None] * n)
        self.meta.extend(metas)
        if chain and n:
            self.next.extend([[t] for t in range(first + 1, first + n)])
            self.next.append([])
            self.npred.append(0)
            self.npred.extend([1] * (n - 1))
        else:
            self.next.extend([[] for _ in range(n)])
            self.npred.extend([0] * n)
        return range(first, first + n)

    def add_many(self, durations: Sequence[float], flows: Sequence[tuple | None], metas: Sequence[Any]) -> range:
        """Fixed tasks (flow None) and flows (``(bytes, latency, cap, resources)``) at once, in order."""
        first = len(self.duration)
        n = len(durations)
        self.duration.extend([d if d > 0.0 else 0.0 for d in durations])
        self.flow.extend(flows)
        self.meta.extend(metas)
        self.next.extend([[] for _ in range(n)])
        self.npred.extend([0] * n)
        return range(first, first + n)

    def add_flow(self, nbytes: float, *, latency: float, cap: float, resources: tuple, meta: Any = None) -> int:
        """A transfer that shares ``resources`` with the other flows active at the same time."""
        return self._add(0.0, (float(nbytes), float(latency), float(cap), resources), meta)

    def add_edge(self, a: int, b: int, *, offset: float | None = None) -> None:
        """``b`` waits for ``a`` to end (or, with ``offset``, for ``a`` to start plus ``offset``)."""
        if offset is None:
            self.next[a].append(b)
        else:
            self.offset_next.setdefault(a, []).append((b, offset))
        self.npred[b] += 1

    @property
    def succ(self) -> Sequence[list[tuple[int, float | None]]]:
        """Every task's successors as ``(task, offset)``; ``offset`` is None for a plain edge."""
        return _Successors(self)

    def __len__(self) -> int:
        return len(self.duration)

    def run(self, capacity: dict[Any, float]) -> float:
        """Simulate; return the time the last task ends. A cycle (deadlock) is an error."""
        n = len(self.duration)
        npred = list(self.npred)
        nan = float("nan")
        start = self.start = [nan] * n
        end = self.end = [nan] * n
        binding = self.binding = [-1] * n
        duration, flows, nxt, offset_next = self.duration, self.flow, self.next, self.offset_next

        # resources as small ints; per flow: (bytes, latency, cap, resources) and its resource ids
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
                        res_cap.append(capacity.get(r, -1.0))  # -1: none given (the flow's own cap applies)
                    ids.append(i)
                flow_res[t] = tuple(ids)
        on_resource: list[set[int]] = [set() for _ in res_cap]
        share = [0.0] * len(res_cap)  # capacity / flows on the resource, for resources with a capacity
        # active flows: bytes left at `updated`, and the rate since then
        active: set[int] = set()
        remaining = [0.0] * n
        rate = [0.0] * n
        updated = [0.0] * n
        version = [0] * n

        # events: (time, seq, kind, task, successor-for-offset-edges or flow version), taken in
        # (time, seq) order. Events for the current time (a task released now, a zero duration)
        # wait in `fifo` rather than the heap: they are made in seq order, and the heap holds
        # nothing earlier, so taking the smaller of the two heads is the same order, cheaper.
        fifo: deque[tuple[float, int, int, int, int]] = deque(
            (0.0, t, _READY, t, -1) for t in range(n) if npred[t] == 0
        )
        heap: list[tuple[float, int, int, int, int]] = []
        seq = n
        push, pop = heapq.heappush, heapq.heappop
        current = 0.0  # the time of the last event taken (every event in fifo is at it)

        def reshare(now: float, resources: tuple[int, ...]) -> None:
            """New rates for the flows that share a resource with one that started or ended."""
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
                when = now + (left if left > 0.0 else 0.0) / r_f
                if when == now:
                    fifo.append((when, seq, _DRAINED, f, version[f]))
                else:
                    push(heap, (when, seq, _DRAINED, f, version[f]))
                seq += 1

        finished = 0
        while fifo or heap:
            if fifo and (not heap or fifo[0] < heap[0]):
                now, _, kind, t, other = fifo.popleft()
            else:
                now, _, kind, t, other = pop(heap)
                current = now
            if kind == _DONE:
                end[t] = now
                finished += 1
                for b in nxt[t]:
                    npred[b] -= 1
                    if npred[b] == 0:
                        binding[b] = t
                        fifo.append((now, seq, _READY, b, -1))
                        seq += 1
            elif kind == _READY:
                start[t] = now
                offs = offset_next.get(t)
                if offs is not None:
                    for b, offset in offs:
                        when = now + offset
                        if when == current:
                            fifo.append((when, seq, _OFFSET, t, b))
                        else:
                            push(heap, (when, seq, _OFFSET, t, b))
                        seq += 1
                flow = flows[t]
                if flow is None:
                    when = now + duration[t]
                    if when == current:
                        fifo.append((when, seq, _DONE, t, -1))
                    else:
                        push(heap, (when, seq, _DONE, t, -1))
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
            elif kind == _DRAINED:
                if t not in active or version[t] != other:
                    continue  # stale: the flow's rate changed after this completion was projected
                active.discard(t)
                resources = flow_res[t]
                for r in resources:
                    on_resource[r].discard(t)
                reshare(now, resources)
                when = now + flows[t][1]
                if when == current:
                    fifo.append((when, seq, _DONE, t, -1))
                else:
                    push(heap, (when, seq, _DONE, t, -1))
                seq += 1
            else:  # _OFFSET: release `other` at the predecessor's start + offset
                npred[other] -= 1
                if npred[other] == 0:
                    binding[other] = t
                    fifo.append((now, seq, _READY, other, -1))
                    seq += 1
        if finished < n:
            stuck = next(t for t in range(n) if end[t] != end[t])
            raise HetplanError(f"the schedule deadlocks: {self.meta[stuck]} never runs (a cycle in its dependencies)")
        return max(end, default=0.0)


class _Successors(Sequence):
    """``engine.succ[a]``: task ``a``'s plain and offset edges as ``(task, offset)``, built on demand."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __len__(self) -> int:
        return len(self._engine.next)

    def __getitem__(self, a: int) -> list[tuple[int, float | None]]:  # type: ignore[override]
        engine = self._engine
        a = range(len(engine.next))[a]  # IndexError and negative indices as a list has them
        return [(b, None) for b in engine.next[a]] + list(engine.offset_next.get(a, []))

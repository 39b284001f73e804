"""SDPipe's semi-decentralised synchronisation: a light central scheduler groups pipelines by progress.

    scheduler = GroupScheduler(pipeline_devices, group_size=2)   # the central process
    scheduler.serve()

    client = GroupClient(scheduler_rank, pipeline=p, rank=dist.get_rank())   # every device
    group = client.ready(step)     # the pipelines this device averages its blocks with, this round
    client.stop()

Each pipeline trains on its own (its replicas all-reduce among themselves, it steps its own
optimizer) and, after each step, averages its weights with the other pipelines of a *group*: the
model traffic is decentralised (group members exchange weights directly, point to point), only the
choice of the group is central. Every device of a pipeline reports ``ready(step)``; once all of a
pipeline's devices have, the pipeline joins the queue of ready pipelines, and the scheduler forms a
group from the first ``group_size`` pipelines in the queue (arrival order: pipelines of similar
progress meet). A pipeline that has no partner left (every other one has finished) gets a group of
one (no averaging). The groups of a run depend on timing; every device of a pipeline receives the
same group, and the scheduler's log says which groups it formed at which step, for the run log.

**Grouping by measured progress** (SDPipe's scheduler, Miao et al. 2023): the scheduler measures each
pipeline's step period (from the answer that released it to its next ready report: its own
compute, not the time it waited for partners, so one mixed group does not make a fast pipeline
look slow; unknown until its second report) and groups pipelines that progress alike, so fast
pipelines average with fast ones and a slow one does not hold a fast one back (:func:`pick_group`).
The longest-waiting ready
pipeline anchors a group; its partners are the ready pipelines whose measured periods are closest
to its own (ties by arrival). When a pipeline still computing is closer in speed than any ready
one and is due (its last report plus its period) within half the anchor's period, the scheduler
waits for it rather than pair the anchor with a pipeline of another speed.

Messages: torch.distributed point-to-point on the default group with their own tag (:data:`TAG`): a
header ``[kind, step, rank, pipeline]``; the answer is ``[n, p_1, ..., p_n, 0...]`` (int64, width
``1 + number of pipelines``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["READY", "STOP", "TAG", "GroupClient", "GroupScheduler", "SchedulerLog", "pick_group"]

READY, STOP = 1, 2
#: The tag of every scheduler message (apart from transfers and the parameter server's).
TAG = (1 << 20) + 1


@dataclass
class SchedulerLog:
    groups: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)  # (pipelines, their steps)


def _distance(a: float | None, b: float | None) -> float:
    """How unalike two measured periods are (a ratio, on a log scale); unknown is farthest."""
    if a is None or b is None or a <= 0 or b <= 0:
        return math.inf
    return abs(math.log(a / b))


def pick_group(
    queue: Sequence[int],
    size: int,
    periods: Mapping[int, float],
    *,
    due: Mapping[int, float] | None = None,
    now: float = 0.0,
) -> tuple[int, ...] | None:
    """The pipelines to group now from the ready ``queue`` (arrival order), or None to wait.

    Args:
        queue: the ready pipelines, longest-waiting first.
        size: the group size (already capped at the pipelines that may still join).
        periods: each pipeline's measured step period (seconds; absent: not measured yet).
        due: when each pipeline still computing is expected ready (its last report plus its period).
        now: the scheduler's clock.

    Returns:
        The group (ascending), or None when fewer than ``size`` are ready or a better-matched
        pipeline is due within half the anchor's period.
    """
    if len(queue) < size or not queue:
        return None
    head = queue[0]
    mine = periods.get(head)
    ranked = sorted(range(1, len(queue)), key=lambda i: (_distance(mine, periods.get(queue[i])), i))
    chosen = [queue[i] for i in ranked[: size - 1]]
    if due and mine is not None and chosen:
        worst = max(_distance(mine, periods.get(q)) for q in chosen)
        for q, at in due.items():
            if _distance(mine, periods.get(q)) < worst and at <= now + 0.5 * mine:
                return None  # a pipeline of the anchor's speed is about to be ready: wait for it
    return tuple(sorted([head, *chosen]))


class GroupScheduler:
    """Forms groups of ready pipelines by measured progress; answers every device of each member."""

    def __init__(self, pipeline_devices: Mapping[int, Sequence[int]], *, group_size: int, clock=time.monotonic) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        self.devices = {p: list(ranks) for p, ranks in pipeline_devices.items()}
        self.group_size = group_size
        self.width = 1 + len(self.devices)
        self.log = SchedulerLog()
        self._clock = clock
        self._reported: dict[int, dict[int, int]] = {p: {} for p in self.devices}  # pipeline -> rank -> step
        self._queue: list[tuple[int, int]] = []  # (pipeline, step), arrival order
        self._finished: set[int] = set()
        self._stopped: dict[int, set[int]] = {p: set() for p in self.devices}
        self._released: dict[int, float] = {}  # pipeline -> when its last group was answered
        self.periods: dict[int, float] = {}  # pipeline -> measured step period (the last one)

    def serve(self) -> None:
        header = torch.zeros(4, dtype=torch.int64)
        while len(self._finished) < len(self.devices):
            src = dist.recv(header, src=None, tag=TAG)
            kind, step, rank, pipeline = (int(x) for x in header)
            if pipeline not in self.devices or rank not in self.devices[pipeline] or src != rank:
                raise RuntimeError(f"group scheduler: rank {src} is not a device of pipeline {pipeline}")
            for group in self.handle(kind, step, rank, pipeline):
                self._answer(group)
        if self._queue:
            raise RuntimeError(f"group scheduler: pipelines left waiting at stop: {self._queue}")

    def handle(self, kind: int, step: int, rank: int, pipeline: int) -> list[tuple[int, ...]]:
        """One device's message; the groups it lets the scheduler form (to answer)."""
        if kind == READY:
            self._reported[pipeline][rank] = step
            if len(self._reported[pipeline]) == len(self.devices[pipeline]):
                steps = set(self._reported[pipeline].values())
                if len(steps) != 1:
                    raise RuntimeError(f"group scheduler: pipeline {pipeline}'s devices report steps {steps}")
                self._reported[pipeline] = {}
                if pipeline in self._released:
                    self.periods[pipeline] = self._clock() - self._released[pipeline]
                self._queue.append((pipeline, step))
        elif kind == STOP:
            self._stopped[pipeline].add(rank)
            if len(self._stopped[pipeline]) == len(self.devices[pipeline]):
                self._finished.add(pipeline)
        else:
            raise RuntimeError(f"group scheduler: unknown message kind {kind} from rank {rank}")
        return self._form_groups()

    def _form_groups(self) -> list[tuple[int, ...]]:
        formed: list[tuple[int, ...]] = []
        while self._queue:
            waiting_for = len(self.devices) - len(self._finished)  # pipelines that may still join
            size = min(self.group_size, waiting_for)
            queued = [p for p, _ in self._queue]
            computing = [p for p in self.devices if p not in self._finished and p not in queued]
            due = {p: self._released[p] + self.periods[p] for p in computing if p in self.periods}
            now = self._clock()
            group = pick_group(queued, size, self.periods, due=due, now=now)
            if group is None:
                return formed
            for p in group:
                self._released[p] = now
            members = [(p, s) for p, s in self._queue if p in group]
            self._queue = [(p, s) for p, s in self._queue if p not in group]
            self.log.groups.append((group, tuple(s for _, s in sorted(members))))
            formed.append(group)
        return formed

    def _answer(self, group: tuple[int, ...]) -> None:
        answer = torch.zeros(self.width, dtype=torch.int64)
        answer[0] = len(group)
        answer[1 : 1 + len(group)] = torch.tensor(group)
        for p in group:
            for rank in self.devices[p]:
                dist.send(answer, dst=rank, tag=TAG)


class GroupClient:
    """A device's side: say it is ready after a step, learn its group, say when it stops."""

    def __init__(self, scheduler: int, *, pipeline: int, rank: int, n_pipelines: int) -> None:
        self.scheduler = scheduler
        self.pipeline = pipeline
        self.rank = rank
        self.width = 1 + n_pipelines

    def _header(self, kind: int, step: int) -> None:
        header = torch.tensor([kind, step, self.rank, self.pipeline], dtype=torch.int64)
        dist.send(header, dst=self.scheduler, tag=TAG)

    def ready(self, step: int) -> tuple[int, ...]:
        """The pipelines (this one included, ascending) to average with after ``step``."""
        self._header(READY, step)
        answer = torch.zeros(self.width, dtype=torch.int64)
        dist.recv(answer, src=self.scheduler, tag=TAG)
        return tuple(int(p) for p in answer[1 : 1 + int(answer[0])])

    def stop(self) -> None:
        self._header(STOP, 0)

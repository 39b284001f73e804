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
progress meet, and a straggler of the moment delays no one but itself). A pipeline that has no
partner left (every other one has finished) gets a group of one (no averaging). The groups of a run
depend on timing; every device of a pipeline receives the same group, and the scheduler's log says
which groups it formed at which step, for the run log.

Messages: torch.distributed point-to-point on the default group with their own tag (:data:`TAG`): a
header ``[kind, step, rank, pipeline]``; the answer is ``[n, p_1, ..., p_n, 0...]`` (int64, width
``1 + number of pipelines``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["READY", "STOP", "TAG", "GroupClient", "GroupScheduler", "SchedulerLog"]

READY, STOP = 1, 2
#: The tag of every scheduler message (apart from transfers and the parameter server's).
TAG = (1 << 20) + 1


@dataclass
class SchedulerLog:
    groups: list[tuple[tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)  # (pipelines, their steps)


class GroupScheduler:
    """Forms groups of ready pipelines in arrival order; answers every device of each member."""

    def __init__(self, pipeline_devices: Mapping[int, Sequence[int]], *, group_size: int) -> None:
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        self.devices = {p: list(ranks) for p, ranks in pipeline_devices.items()}
        self.group_size = group_size
        self.width = 1 + len(self.devices)
        self.log = SchedulerLog()
        self._reported: dict[int, dict[int, int]] = {p: {} for p in self.devices}  # pipeline -> rank -> step
        self._queue: list[tuple[int, int]] = []  # (pipeline, step), arrival order
        self._finished: set[int] = set()
        self._stopped: dict[int, set[int]] = {p: set() for p in self.devices}

    def serve(self) -> None:
        header = torch.zeros(4, dtype=torch.int64)
        while len(self._finished) < len(self.devices):
            src = dist.recv(header, src=None, tag=TAG)
            kind, step, rank, pipeline = (int(x) for x in header)
            if pipeline not in self.devices or rank not in self.devices[pipeline] or src != rank:
                raise RuntimeError(f"group scheduler: rank {src} is not a device of pipeline {pipeline}")
            if kind == READY:
                self._reported[pipeline][rank] = step
                if len(self._reported[pipeline]) == len(self.devices[pipeline]):
                    steps = set(self._reported[pipeline].values())
                    if len(steps) != 1:
                        raise RuntimeError(f"group scheduler: pipeline {pipeline}'s devices report steps {steps}")
                    self._reported[pipeline] = {}
                    self._queue.append((pipeline, step))
            elif kind == STOP:
                self._stopped[pipeline].add(rank)
                if len(self._stopped[pipeline]) == len(self.devices[pipeline]):
                    self._finished.add(pipeline)
            else:
                raise RuntimeError(f"group scheduler: unknown message kind {kind} from rank {rank}")
            self._form_groups()
        if self._queue:
            raise RuntimeError(f"group scheduler: pipelines left waiting at stop: {self._queue}")

    def _form_groups(self) -> None:
        while self._queue:
            waiting_for = len(self.devices) - len(self._finished)  # pipelines that may still join
            size = min(self.group_size, waiting_for)
            if len(self._queue) < size:
                return
            members, self._queue = self._queue[:size], self._queue[size:]
            group = tuple(sorted(p for p, _ in members))
            self.log.groups.append((group, tuple(s for _, s in sorted(members))))
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

"""SDPipe with four pipelines, two fast and two slow, in real processes over gloo: the central
scheduler groups the fast ones with each other and the slow ones with each other, the only right
grouping, and each group averages exactly its members' weights.

Deterministic: no pipeline sleeps and the scheduler reads no wall clock. It runs on a virtual clock
(as ``test_sdpipe_groups.py`` drives it): pipeline ``p``'s ready report after a step comes
``PERIOD[p]`` after the answer that released it, its stop at that answer. The central process
handles the messages in that virtual order (the earliest due first, ties by pipeline), waiting for
the one due next when it has not arrived yet, so the real processes' timing decides nothing. What
runs for real: the group scheduler's policy and bookkeeping (:meth:`GroupScheduler.handle`), its
answers to every member, and each device's :class:`GroupAverage` (the scheduler's client and the
point-to-point weight swap).

At virtual time 3 all four report together (the fast ones' third step, the slow ones' first) in
pipeline order, where grouping by arrival would pair fast pipeline 0 with slow pipeline 1; two
scenarios, 0's fast partner 2 or 3, show the groups follow the measured periods, not indices. (0 is
fast in both: a pipeline's period is unknown until its second report, so a slow one that anchors a
round on its first report is grouped by arrival, as the scheduler's doc says.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import spawn_ranks

from hetplan.runtime.sync.group_scheduler import READY, STOP, TAG, GroupClient, GroupScheduler
from hetplan.runtime.sync.wave_sync import GroupAverage

WORKERS = 4  # ranks 0-3, one device per pipeline; rank 4 is the central process
STEPS = 4
BATCHES = {0: 1, 1: 3, 2: 2, 3: 2}
#: per scenario, each pipeline's step period on the virtual clock (1: fast, 3: slow)
SCENARIOS = [{0: 1.0, 1: 3.0, 2: 1.0, 3: 3.0}, {0: 1.0, 1: 3.0, 2: 3.0, 3: 1.0}]


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class VirtualTimeScheduler(GroupScheduler):
    """The group scheduler served in virtual-time order (see the module doc)."""

    def __init__(self, periods: dict[int, float], *, steps: int) -> None:
        self.clock = _Clock()
        super().__init__({p: [p] for p in periods}, group_size=2, clock=self.clock)
        self.period = periods
        self.steps = steps
        self.released = dict.fromkeys(periods, 0.0)  # virtual time of each pipeline's last answer
        self.reports = dict.fromkeys(periods, 0)  # ready reports so far
        self.queued: set[int] = set()
        self.done: set[int] = set()

    def _due(self, p: int) -> float:
        """When pipeline ``p`` (computing) sends its next message: a ready report, or its stop."""
        return self.released[p] + (self.period[p] if self.reports[p] < self.steps else 0.0)

    def serve(self) -> None:
        held: dict[int, tuple[int, int, int]] = {}  # pipeline -> (kind, step, rank), received early
        header = torch.zeros(4, dtype=torch.int64)
        while len(self.done) < len(self.devices):
            computing = [p for p in self.devices if p not in self.done and p not in self.queued]
            p = min(computing, key=lambda q: (self._due(q), q))
            while p not in held:
                src = dist.recv(header, src=None, tag=TAG)
                kind, step, rank, pipeline = (int(x) for x in header)
                assert src == rank and pipeline not in held
                held[pipeline] = (kind, step, rank)
            kind, step, rank = held.pop(p)
            self.clock.t = self._due(p)
            if kind == READY:
                assert step == self.reports[p]
                self.reports[p] += 1
                self.queued.add(p)
            else:
                assert kind == STOP and self.reports[p] == self.steps
                self.done.add(p)
            for group in self.handle(kind, step, rank, p):
                for q in group:
                    self.released[q] = self.clock.t
                    self.queued.discard(q)
                self._answer(group)
        assert not held


def _run(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        for i, periods in enumerate(SCENARIOS):
            _scenario(rank, world, Path(out) / f"scenario-{i}", periods)
            dist.barrier()  # a scheduler serves one scenario: none of the next one's messages may reach it
    finally:
        dist.destroy_process_group()


def _scenario(rank: int, world: int, out: Path, periods: dict[int, float]) -> None:
    central = world - 1
    if rank == central:
        out.mkdir(parents=True, exist_ok=True)
        scheduler = VirtualTimeScheduler(periods, steps=STEPS)
        scheduler.serve()
        torch.save({"groups": scheduler.log.groups, "periods": dict(scheduler.periods)}, out / "scheduler.pt")
        return
    client = GroupClient(central, pipeline=rank, rank=rank, n_pipelines=WORKERS)
    avg = GroupAverage(client, pipeline=rank, peers={q: q for q in range(WORKERS)}, batches=BATCHES)
    weights = torch.full((5,), float(rank + 1)) + torch.arange(5.0)
    record = []
    for step in range(STEPS):
        new = avg.after_step(step, weights)
        record.append((avg.log[-1], weights.clone(), new.clone()))
        weights = new * 1.5 + rank  # each pipeline's local step makes them differ again
    avg.stop()
    out.mkdir(parents=True, exist_ok=True)
    torch.save(record, out / f"pipeline-{rank}.pt")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """Every scenario in one spawn of five processes (start-up dominates)."""
    tmp = tmp_path_factory.mktemp("sdpipe4")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    spawn_ranks(_run, args=(WORKERS + 1, f"file://{tmp / 'store'}", str(tmp)), nprocs=WORKERS + 1)
    out = []
    for i in range(len(SCENARIOS)):
        folder = tmp / f"scenario-{i}"
        out.append(
            {**torch.load(folder / "scheduler.pt"), **{p: torch.load(folder / f"pipeline-{p}.pt") for p in range(4)}}
        )
    return out


@pytest.mark.parametrize(("index", "fast", "slow"), [(0, (0, 2), (1, 3)), (1, (0, 3), (1, 2))])
def test_fast_pipelines_average_with_each_other_and_slow_with_slow(
    results: list[dict], index: int, fast: tuple[int, int], slow: tuple[int, int]
) -> None:
    result = results[index]
    assert {p for p, period in SCENARIOS[index].items() if period == 1.0} == set(fast)
    # every step of every pipeline: its group is its own speed's pair, never a mixed one
    for members in (fast, slow):
        for p in members:
            assert [group for group, _, _ in result[p]] == [members] * STEPS, (p, result[p])
    # the scheduler measured the periods it grouped by (the virtual clock's, exactly)
    assert result["periods"] == SCENARIOS[index]
    # at virtual time 3 all four were ready in pipeline order: by arrival, 0 would have met 1 (slow in
    # both scenarios); the scheduler formed the speed-matched pairs instead, at the members' steps
    assert (fast, (2, 2)) in result["groups"] and (slow, (0, 0)) in result["groups"]
    assert len(result["groups"]) == 2 * STEPS


@pytest.mark.parametrize("index", range(len(SCENARIOS)))
def test_each_group_averages_exactly_its_members_weights(results: list[dict], index: int) -> None:
    result = results[index]
    for group, steps in result["groups"]:
        member = {q: result[q][s] for q, s in zip(group, steps, strict=True)}
        total = sum(BATCHES[q] for q in group)
        expect = sum(member[q][1].double() * BATCHES[q] / total for q in group).float()
        for q in group:
            assert member[q][0] == group
            assert torch.equal(member[q][2], member[group[0]][2])  # the same bits on every member
            torch.testing.assert_close(member[q][2], expect, atol=1e-6, rtol=0)

"""SDPipe's central scheduler groups pipelines by measured progress: two fast and two slow pipelines
(periods 1 and 3) reach a round together and the only right grouping, fast with fast, is formed,
where arrival order alone would pair a fast one with a slow one."""

from __future__ import annotations

from hetplan.runtime.sync.group_scheduler import READY, STOP, GroupScheduler, pick_group


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _scheduler(clock: _Clock) -> GroupScheduler:
    return GroupScheduler({p: [p + 1] for p in range(4)}, group_size=2, clock=clock)


def _ready(s: GroupScheduler, clock: _Clock, t: float, pipeline: int, step: int) -> list[tuple[int, ...]]:
    clock.t = t
    return s.handle(READY, step, pipeline + 1, pipeline)


def _rounds(fast: tuple[int, int], slow: tuple[int, int], order_at_3: list[int]) -> list[tuple[int, ...]]:
    """Fast pipelines ready at t = 1, 2, 3; slow ones at 3; at t = 3 they arrive in ``order_at_3``."""
    clock = _Clock()
    s = _scheduler(clock)
    formed = []
    for t in (1.0, 2.0):
        for p in fast:
            formed += _ready(s, clock, t, p, int(t) - 1)
    assert formed == [tuple(sorted(fast))] * 2  # the fast ones meet each other every round
    at3 = []
    for p in order_at_3:
        at3 += _ready(s, clock, 3.0 + 0.001 * len(at3), p, 2 if p in fast else 0)
    for p in range(4):
        s.handle(STOP, 0, p + 1, p)
    return at3


def test_fast_pipelines_group_with_each_other_not_in_arrival_order() -> None:
    # arrival order 0 (fast), 2 (slow), 1 (fast), 3 (slow): first come would give (0, 2), (1, 3)
    groups = _rounds(fast=(0, 1), slow=(2, 3), order_at_3=[0, 2, 1, 3])
    assert groups == [(0, 1), (2, 3)]


def test_the_grouping_follows_the_measurements_not_the_indices() -> None:
    # the same arrival order, but now 0 and 2 are the fast ones: the other grouping is right
    groups = _rounds(fast=(0, 2), slow=(1, 3), order_at_3=[0, 1, 2, 3])
    assert groups == [(0, 2), (1, 3)]


def test_pick_group_waits_for_a_due_pipeline_of_the_anchors_speed() -> None:
    periods = {0: 1.0, 1: 1.0, 2: 3.0}
    assert pick_group([0, 2], 2, periods, due={1: 3.2}, now=3.0) is None  # 1 is due in 0.2 s: wait
    assert pick_group([0, 2], 2, periods, due={1: 9.0}, now=3.0) == (0, 2)  # not due soon: go
    assert pick_group([0, 2, 1], 2, periods, due={}, now=3.0) == (0, 1)
    assert pick_group([0], 2, periods) is None
    assert pick_group([2], 1, periods) == (2,)

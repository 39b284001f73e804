"""The planning-speed caches of issue 24 give what computing every value afresh gives."""

from __future__ import annotations

from test_baseline_scoring import _tp_instance

from hetplan.simulate.bounds import iteration_lower_bound
from hetplan.solve import PlanOptions
from hetplan.solve.baselines import _memo, _uniform_families, balanced_cuts


def test_a_shared_members_memo_gives_every_bound_that_a_fresh_one_gives() -> None:
    profile, cluster = _tp_instance()
    families = _uniform_families(profile, cluster, PlanOptions(global_batch=32, max_stages=8), None)
    plans = [plan for configs in families.values() for plan in configs]
    assert len(plans) >= 4 and any(s.tensor_parallel > 1 for p in plans for s in p.pipelines[0].stages)
    shared: dict[tuple, tuple] = {}
    for plan in plans + plans[::-1]:  # the second pass reads only what the first one stored
        assert iteration_lower_bound(plan, profile, cluster, members=shared) == iteration_lower_bound(
            plan, profile, cluster
        )
    assert shared


def test_memoised_cuts_are_computed_once_per_input_and_never_shared() -> None:
    weights = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
    calls: list[int] = []

    def cuts(stages: int) -> list[int]:
        calls.append(stages)
        return balanced_cuts(weights, stages)

    cached = _memo(cuts)
    first = cached(3)
    first.append(99)  # a caller changing its list must not change the next caller's
    assert [cached(s) for s in (3, 2, 3, 2)] == [balanced_cuts(weights, s) for s in (3, 2, 3, 2)]
    assert calls == [3, 2]

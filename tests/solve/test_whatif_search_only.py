"""What-if plans its candidates by the search alone and only the chosen one with the baselines."""

from __future__ import annotations

from dataclasses import replace

from test_whatif import OPTS, PROFILE, _space

from hetplan.solve.training import plan_training
from hetplan.solve.whatif import Objective, what_if


def test_candidates_skip_the_baselines_and_the_chosen_plan_is_planned_in_full() -> None:
    opts = replace(OPTS, baselines=True)
    calls: list[bool] = []

    def plan(profile, cluster, options):
        calls.append(options.baselines)
        return plan_training(profile, cluster, options)

    result = what_if(PROFILE, _space(), opts, Objective("fastest"), plan=plan, marginals=False)
    assert result.chosen is not None and len(calls) >= 2
    assert calls[-1] is True and not any(calls[:-1])  # one full plan, after every candidate's search
    full = plan_training(PROFILE, result.chosen.cluster, opts)
    assert result.chosen.result.plan.to_dict() == full.plan.to_dict()
    assert set(result.chosen.result.baselines) == set(full.baselines) != set()


def test_search_only_options_are_passed_through_unchanged() -> None:
    seen: list = []

    def plan(profile, cluster, options):
        seen.append(options)
        return plan_training(profile, cluster, options)

    what_if(PROFILE, _space(), OPTS, Objective("fastest"), plan=plan, marginals=False)
    assert seen and all(o == OPTS for o in seen)  # baselines already off: nothing planned twice

"""What-if plans its candidates by a cheaper search and only the chosen one in full."""

from __future__ import annotations

from dataclasses import replace

from test_whatif import OPTS, PROFILE, _space

from hetplan.solve.training import plan_training
from hetplan.solve.whatif import FINAL_TOP_K, FULL_PLAN_WORK, Objective, candidate_options, final_options, what_if


def test_candidates_skip_the_baselines_and_the_chosen_plan_is_planned_in_full() -> None:
    opts = replace(OPTS, baselines=True)
    calls: list[bool] = []

    def plan(profile, cluster, options):
        calls.append(options.baselines)
        return plan_training(profile, cluster, options)

    result = what_if(PROFILE, _space(), opts, Objective("fastest"), plan=plan, marginals=False)
    assert result.chosen is not None and len(calls) >= 2
    assert calls[-1] is True and not any(calls[:-1])  # one full plan, after every candidate's search
    full = plan_training(PROFILE, result.chosen.cluster, final_options(opts, result.chosen))
    assert result.chosen.result.plan.to_dict() == full.plan.to_dict()
    assert set(result.chosen.result.baselines) == set(full.baselines) != set()


def test_candidates_get_the_cheap_options_and_the_chosen_one_the_given_options() -> None:
    seen: list = []

    def plan(profile, cluster, options):
        seen.append(options)
        return plan_training(profile, cluster, options)

    what_if(PROFILE, _space(), OPTS, Objective("fastest"), plan=plan, marginals=False)
    cheap = candidate_options(OPTS)
    assert not cheap.baselines and not cheap.refine and cheap.top_k == 1
    assert seen[-1] == OPTS  # a small chosen plan: planned as `hetplan plan` plans it
    assert len(seen) >= 2 and all(o == cheap for o in seen[:-1])


def test_a_large_chosen_plan_is_planned_with_the_estimates_best_only() -> None:
    result = what_if(PROFILE, _space(), OPTS, Objective("fastest"), marginals=False)
    chosen = result.chosen
    assert final_options(OPTS, chosen) == OPTS  # a few devices, a handful of tasks
    big = replace(chosen, result=replace(chosen.result, sim=replace(chosen.result.sim, n_tasks=FULL_PLAN_WORK + 1)))
    assert final_options(OPTS, big) == replace(OPTS, top_k=FINAL_TOP_K)


def test_options_that_set_top_k_keep_it() -> None:
    opts = replace(OPTS, top_k=5)
    assert candidate_options(opts).top_k == 5 and final_options(opts).top_k == 5

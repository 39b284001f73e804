"""The whole planner: the search, the baselines beside it, and the fastest of them all.

    result = plan_training(profile, cluster, PlanOptions(global_batch=512))
    result.plan            # pipelines, stages, batch shares, micro-batches, predictions
    result.sim             # the simulated iteration of the chosen plan
    result.baselines       # uniform, DeepSpeed's, homogeneous, data parallel: each scored the same way

The one module that depends on both :mod:`hetplan.solve.search` and :mod:`hetplan.solve.baselines`,
so neither depends on the other's caller: baselines that run a planner of their own (the
homogeneous ones) call the search alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan, check_shared_sync, parse_plan
from hetplan.errors import HetplanError
from hetplan.simulate import simulate
from hetplan.simulate.simulator import SimResult
from hetplan.solve.background import Deferred
from hetplan.solve.baselines import baseline_plans, fastest_uniform_tp_pp, homogeneous_baselines
from hetplan.solve.search import Candidate, PlanOptions, PlanResult, best_plan, lower_bound, search_plans
from hetplan.solve.sync_refine import refine_for_sync
from hetplan.solve.ties import degrees_the_runtime_runs

__all__ = ["plan_training"]

#: From this many devices some baselines run in a second process (below, they take less than
#: starting one: milliseconds on the bundled small clusters).
_BACKGROUND_DEVICES = 64


def plan_training(
    profile: ModelProfile,
    cluster: Cluster,
    opts: PlanOptions,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> PlanResult:
    """Search for the fastest plan, score the baselines on the same simulator, keep the fastest
    (baselines are candidates too: the plan is never slower than any of them)."""
    # the homogeneous baselines and the lower bound need no search result: on a large cluster they
    # run beside the search (and the Megatron-style family beside the other baselines)
    check_shared_sync(profile, opts.sync, file=None, field="--sync")
    profile = degrees_the_runtime_runs(profile)  # a tied model outside the zoo: no TP
    beside = len(cluster.devices) >= _BACKGROUND_DEVICES
    independent = Deferred(_independent, profile, cluster, opts, background=beside) if beside else None
    try:
        searched = search_plans(profile, cluster, opts, progress=progress)
        reference = min(searched.scored, key=lambda c: c.sim.iteration_s).plan if searched.scored else None
        megatron: dict[str, Candidate | None] = {}
        if opts.baselines and independent is not None and not independent.ready():
            # the second core is still on the homogeneous searches: the Megatron-style family here
            # meanwhile, not in a third process after them
            megatron["megatron"] = fastest_uniform_tp_pp(profile, cluster, opts, reference)
        homogeneous, lower = independent.result() if independent is not None else (None, None)
        baselines = {}
        if opts.baselines:
            baselines = baseline_plans(
                profile, cluster, opts, reference, homogeneous=homogeneous, background=beside, **megatron
            )
    finally:
        if independent is not None:
            independent.close()
    result = best_plan(searched, baselines, profile, cluster, opts, lower_bound=lower)
    if opts.sync != "allreduce":
        result = _for_sync(result, profile, cluster, opts)
    return result


def _independent(
    profile: ModelProfile, cluster: Cluster, opts: PlanOptions
) -> tuple[dict[str, Candidate | None] | None, float]:
    """What needs no search result: the homogeneous baselines (where asked for) and the plan's
    lower bound (its LP is the only user of scipy on the planning path, whose import alone is half
    a second: in the second process it stays out of the planning one)."""
    homogeneous = homogeneous_baselines(profile, cluster, opts) if opts.baselines else None
    return homogeneous, lower_bound(profile, cluster, opts)


def _for_sync(result: PlanResult, profile: ModelProfile, cluster: Cluster, opts: PlanOptions) -> PlanResult:
    """The fastest candidate when it synchronises by ``opts.sync``: the winner and every simulated
    candidate of the search and the baselines, each re-simulated under the mode (the structures,
    cuts and batch shares chosen as for the all-reduce), then the fastest one's cuts and shares
    re-balanced under the mode by the simulator (:mod:`hetplan.solve.sync_refine`); candidates the mode cannot run
    (ZeRO-1, tensor-parallel stages for adasum/wsp/sdpipe, differently shaped pipelines for sdpipe)
    are left out, and if none is left the one-line error says why."""
    pool = [("plan", result.plan)] + [(c.label, c.plan) for c in result.candidates]
    pool += [(name, c.plan) for name, c in result.baselines.items() if c is not None]
    best: tuple[float, str, Plan, SimResult] | None = None
    reasons: list[str] = []
    for label, plan in pool:
        data = plan.to_dict()
        data["sync"] = opts.sync
        data["sync_options"] = dict(opts.sync_options)
        data.setdefault("inputs", {"profile": {"path": "-"}, "cluster": {"path": "-"}})
        try:
            moded = parse_plan(data, file=plan.file)
            moded.inputs = plan.inputs
            sim = simulate(moded, profile, cluster)
        except HetplanError as exc:
            reasons.append(exc.reason)
            continue
        if not all(d.memory.fits for d in sim.devices.values()):
            continue
        if best is None or sim.iteration_s < best[0]:
            best = (sim.iteration_s, label, moded, sim)
    if best is None:
        why = reasons[0] if reasons else "no candidate fits in memory"
        raise HetplanError(f"no plan found can run sync {opts.sync}: {why}", field="--sync")
    _, label, plan, sim = best
    if opts.refine:
        plan, sim, moves = refine_for_sync(plan, sim, profile, cluster)
        if moves:
            label = f"{label}, cuts and shares re-balanced for {opts.sync} ({moves} moves)"
    return replace(result, plan=plan, sim=sim, label=label)

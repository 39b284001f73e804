"""Cuts and batch shares re-balanced for a sync mode other than the all-reduce.

    plan, sim, moves = refine_for_sync(plan, sim, profile, cluster)

The search chooses structures, cuts and batch shares with the all-reduce's costs in its closed
form; the winner under another mode is re-scored by the simulator (training.py), but its cuts and
shares are still those that balanced the all-reduce's iteration. Under the other modes the balance
point moves: with ``wsp`` no pipeline waits for a gradient group (each pays its share of the wave's
push and pull instead), with ``sdpipe`` every pipeline runs at its own pace (the job's rate is the
sum of theirs), with ``adasum`` and ``topk`` the exposed synchronisation of each stage changes
(all-gathers instead of all-reduces). This hill-climbs from the re-scored winner with the simulator
*of the mode* as the objective: steepest descent over one cut moved by one block (in one pipeline,
or in every pipeline at once so that equally shaped pipelines stay equal, which ``sdpipe`` needs)
and one micro-batch of samples (or one sample) moved between two pipelines. Every accepted move
lowers the simulated iteration, so the result is never worse than the re-scored plan; the number of
simulated tasks is capped (deterministic, unlike a time limit).
"""

from __future__ import annotations

from dataclasses import replace

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.errors import HetplanError
from hetplan.simulate.simulator import SimResult
from hetplan.solve.batching import micro_batch_list
from hetplan.solve.search import simulate_or_none

__all__ = ["SYNC_REFINE_TASKS", "refine_for_sync"]

SYNC_REFINE_TASKS = 150_000  # simulated tasks the hill-climb may spend (about 1-2 s here)
_ROUNDS = 60


def _moved_cut(stages: tuple[Stage, ...], si: int, delta: int) -> tuple[Stage, ...] | None:
    """``stages`` with the cut before stage ``si`` moved by ``delta`` blocks; None where a stage
    would be left empty."""
    a, b = stages[si - 1], stages[si]
    cut = b.start + delta
    if not a.start < cut < b.end:
        return None
    out = list(stages)
    out[si - 1] = replace(a, end=cut)
    out[si] = replace(b, start=cut)
    return tuple(out)


def _cut_moves(plan: Plan) -> list[Plan]:
    """One cut moved by one block in one pipeline, and the same cut moved in every pipeline that has
    that many stages at once (keeps equally shaped pipelines equal)."""
    out: list[Plan] = []
    pipes = plan.pipelines
    for si in range(1, max(len(p.stages) for p in pipes)):
        for delta in (-1, 1):
            together = list(pipes)
            changed = 0
            for pi, p in enumerate(pipes):
                if si >= len(p.stages):
                    continue
                stages = _moved_cut(p.stages, si, delta)
                if stages is None:
                    continue
                alone = list(pipes)
                alone[pi] = Pipeline(p.batch, p.micro_batches, stages)
                out.append(replace(plan, pipelines=alone))
                together[pi] = alone[pi]
                changed += 1
            if changed > 1:
                out.append(replace(plan, pipelines=together))
    return out


def _share_moves(plan: Plan, micro_of: list[int]) -> list[Plan]:
    """One micro-batch of the giver's size, or one sample, moved from one pipeline to another; each
    keeps its micro-batch size (a remainder becomes a smaller first micro-batch)."""
    out: list[Plan] = []
    pipes = plan.pipelines
    for src, s in enumerate(pipes):
        for size in sorted({micro_of[src], 1}, reverse=True):
            if s.batch <= size:
                continue
            for dst, d in enumerate(pipes):
                if dst == src:
                    continue
                moved = list(pipes)
                moved[src] = Pipeline(s.batch - size, micro_batch_list(s.batch - size, micro_of[src]), s.stages)
                moved[dst] = Pipeline(d.batch + size, micro_batch_list(d.batch + size, micro_of[dst]), d.stages)
                out.append(replace(plan, pipelines=moved))
    return out


def _score(trial: Plan, profile: ModelProfile, cluster: Cluster) -> SimResult | None:
    """The trial's simulated iteration; None where it does not fit or the mode or the profile cannot
    run it (a TP degree a moved block has no profile for, differently shaped pipelines under sdpipe)."""
    try:
        return simulate_or_none(trial, profile, cluster)
    except HetplanError:
        return None


def refine_for_sync(
    plan: Plan, sim: SimResult, profile: ModelProfile, cluster: Cluster, *, budget_tasks: int = SYNC_REFINE_TASKS
) -> tuple[Plan, SimResult, int]:
    """Steepest descent on the plan's cuts and batch shares under its own sync mode; returns the
    plan, its simulation and how many moves were taken (0: the re-scored plan was kept)."""
    micro_of = [max(p.micro_batches) for p in plan.pipelines]
    budget = budget_tasks
    taken = 0
    for _ in range(_ROUNDS):
        best_plan, best_sim = plan, sim
        for trial in _cut_moves(plan) + (_share_moves(plan, micro_of) if len(plan.pipelines) > 1 else []):
            if budget <= 0:
                break
            result = _score(trial, profile, cluster)
            budget -= sim.n_tasks
            if result is not None and result.iteration_s < best_sim.iteration_s * (1 - 1e-9):
                best_plan, best_sim = trial, result
        if best_plan is plan:
            break
        plan, sim = best_plan, best_sim
        taken += 1
    return plan, sim, taken

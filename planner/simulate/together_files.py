"""``hetplan simulate PLAN_A PLAN_B --together``: load the plans and their inputs, co-simulate, draw.

    result = co_simulate_files(["a.yaml", "b.yaml"], policy="first-come", timeline="co.svg")

Jobs are labelled ``A``, ``B``, ... in the order given (the same file twice is two copies of one
job). Files that cannot be written fail before the simulation, as ``hetplan simulate`` does.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from pathlib import Path

from hetplan.contracts.plan import load_plan, load_plan_inputs
from hetplan.errors import HetplanError
from hetplan.simulate.timeline import check_timeline_path
from hetplan.simulate.together import TogetherJob, TogetherResult, simulate_together
from hetplan.simulate.together_checks import check_same_cluster
from hetplan.simulate.together_draw import write_together_timeline, write_together_trace
from hetplan.simulate.trace import check_trace_path

__all__ = ["co_simulate_files", "load_jobs"]


def load_jobs(plan_files: Sequence[str | Path]) -> list[TogetherJob]:
    """Each plan with the profile and cluster it names (sha256 checked), labelled A, B, ...; the
    clusters must be one (:func:`check_same_cluster`)."""
    if len(plan_files) < 2:
        raise HetplanError("--together needs two plans: hetplan simulate PLAN_A PLAN_B --together", field="PLAN")
    if len(plan_files) > len(string.ascii_uppercase):
        raise HetplanError(f"at most {len(string.ascii_uppercase)} plans can be simulated together", field="PLAN")
    jobs = []
    for label, path in zip(string.ascii_uppercase, plan_files, strict=False):
        plan = load_plan(path)
        profile, cluster = load_plan_inputs(plan)
        jobs.append(TogetherJob(label, plan, profile, cluster))
    check_same_cluster(jobs)
    return jobs


def co_simulate_files(
    plan_files: Sequence[str | Path],
    *,
    policy: str = "first-come",
    iterations: int = 6,
    timeline: str | Path | None = None,
    trace: str | Path | None = None,
) -> tuple[TogetherResult, list[TogetherJob]]:
    """Co-simulate the plans; write the timeline and trace asked for; return the result and the jobs."""
    if timeline:
        check_timeline_path(timeline)
    if trace:
        check_trace_path(trace)
    jobs = load_jobs(plan_files)
    result = simulate_together(jobs, policy=policy, iterations=iterations, timeline=bool(timeline or trace))
    names = " + ".join(Path(j.plan.file or j.label).name for j in jobs)
    emulated = any(jobs[0].cluster.device(a).type.emulated for j in jobs for a in j.plan.all_devices())
    title = f"{names} on {jobs[0].cluster.name}, {policy}" + (" (EMULATED device speeds)" if emulated else "")
    if timeline:
        write_together_timeline(result, timeline, title=title)
    if trace:
        write_together_trace(result, trace, title=title)
    return result, jobs

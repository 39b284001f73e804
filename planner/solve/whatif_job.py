"""``hetplan what-if``: load the inputs, turn the options into an objective, search, write the files.

    summary, written = run_what_if(WhatIfRequest(profile="gpt.yaml", cluster="c.yaml", pool="pool.yaml",
                                                 global_batch=1024, objective="cheapest-per-step", output="wi/"))

The CLI only parses and prints; everything between lives here (:mod:`hetplan.solve.whatif` searches,
:mod:`hetplan.solve.whatif_report` summarises and writes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetplan.contracts.cluster import load_cluster
from hetplan.contracts.model_profile import ModelProfile, load_profile
from hetplan.contracts.pool import load_pool
from hetplan.contracts.yamlio import read_mapping
from hetplan.errors import HetplanError
from hetplan.solve.search import PlanOptions
from hetplan.solve.whatif import Objective, what_if, what_if_space
from hetplan.solve.whatif_report import what_if_summary, write_what_if

__all__ = ["WhatIfRequest", "objective_from", "run_what_if"]


@dataclass(frozen=True)
class WhatIfRequest:
    """The command's options. ``samples``/``tokens``: the run's length; ``deadline_hours`` needs one."""

    profile: str
    cluster: str
    global_batch: int
    output: str
    pool: str | None = None
    objective: str = "fastest"
    min_samples_per_s: float | None = None
    deadline_hours: float | None = None
    samples: int | None = None
    tokens: int | None = None
    budget_per_hour: float | None = None
    max_plans: int | None = None
    ladder: int = 0
    marginals: bool = True
    micro_batch_sizes: tuple[int, ...] | None = None
    optimizer: str = "adam"
    schedule: str = "1f1b"


def _run_samples(req: WhatIfRequest, profile: ModelProfile) -> int | None:
    if req.samples is not None and req.tokens is not None:
        raise HetplanError("give --samples or --tokens, not both", field="--tokens")
    if req.tokens is None:
        return req.samples
    seq = profile.model.get("config", {}).get("seq") if isinstance(profile.model, dict) else None
    if not isinstance(seq, int) or seq <= 0:
        raise HetplanError(
            "--tokens needs the model's sequence length (config.seq); this profile has none: use --samples",
            file=req.profile,
            field="model.config.seq",
        )
    return math.ceil(req.tokens / seq)


def objective_from(req: WhatIfRequest, run_samples: int | None) -> Objective:
    """The objective and its constraints; a missing companion option is a one-line error."""
    limits = []
    if req.min_samples_per_s is not None:
        limits.append(req.global_batch / req.min_samples_per_s)
    if req.deadline_hours is not None:
        if run_samples is None:
            raise HetplanError(
                "--deadline-hours needs the run's length: --samples or --tokens", field="--deadline-hours"
            )
        steps = math.ceil(run_samples / req.global_batch)
        limits.append(req.deadline_hours * 3600.0 / steps)
    if req.objective == "cheapest-meeting" and not limits:
        raise HetplanError(
            "cheapest-meeting needs --min-samples-per-s or --deadline-hours (with --samples or --tokens)",
            field="--objective",
        )
    if req.objective == "fastest-within-budget" and req.budget_per_hour is None:
        raise HetplanError("fastest-within-budget needs --budget-per-hour", field="--objective")
    if req.objective == "cheapest-run" and run_samples is None:
        raise HetplanError("cheapest-run needs the run's length: --samples or --tokens", field="--objective")
    return Objective(
        name=req.objective,
        max_iteration_s=min(limits) if limits else None,
        budget_per_hour=req.budget_per_hour,
        run_samples=run_samples,
    )


def run_what_if(
    req: WhatIfRequest, *, progress: Callable[[int, tuple[int, ...]], None] | None = None
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Search, summarise, write ``output/{summary.json, cluster.yaml, plan.yaml}``."""
    profile = load_profile(req.profile)
    base = load_cluster(req.cluster)
    pool = load_pool(req.pool) if req.pool else None
    run_samples = _run_samples(req, profile)
    objective = objective_from(req, run_samples)
    space = what_if_space(base, read_mapping(req.cluster), pool, ladder=req.ladder)
    opts = PlanOptions(
        global_batch=req.global_batch,
        schedule=req.schedule,
        optimizer=req.optimizer,
        micro_batch_sizes=req.micro_batch_sizes,
    )
    result = what_if(
        profile, space, opts, objective, max_plans=req.max_plans, marginals=req.marginals, progress=progress
    )
    summary = what_if_summary(result, run_samples=run_samples)
    written = write_what_if(result, summary, profile_path=req.profile, output=req.output, dtype=profile.dtype)
    return summary, written

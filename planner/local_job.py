"""Train a plan on this machine: its rank config, every rank spawned here, and what it did.

    job = train_here(plan, profile, cluster, steps=20, emulate=True, log="run.jsonl")
    job.summary      # 'trained 20 steps on 2 ranks (EMULATED device speeds): loss 6.26 -> 5.56; ...'

What ``hetplan launch`` runs (cli.py only parses and prints). It orchestrates layers, as
:mod:`hetplan.demo` does: the rank config (:mod:`hetplan.emit`), the checks that should fail once
here rather than once per rank (a text file, a user dataset), and the local launcher
(:mod:`hetplan.runtime.launcher`).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.emulation import SlowdownSchedule, Straggler
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError

__all__ = ["LocalJob", "TrainingOptions", "train_here"]


@dataclass(frozen=True)
class TrainingOptions:
    """How the ranks train, beyond the plan (``build_rank_config``'s keywords; defaults: the plan's)."""

    seed: int = 0
    lr: float | None = None
    optimizer: str | None = None
    weight_decay: float | None = None
    clip_grad_norm: float | None = None
    warmup_steps: int = 0
    decay_steps: int = 0
    min_lr: float = 0.0
    data: str | None = None
    dataset: str | None = None
    dataset_kwargs: dict[str, Any] = field(default_factory=dict)

    def rank_config_kwargs(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "lr": self.lr,
            "optimizer": self.optimizer,
            "weight_decay": self.weight_decay,
            "clip_grad_norm": self.clip_grad_norm,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "min_lr": self.min_lr,
            "data": self.data,
            "dataset": self.dataset,
            "dataset_kwargs": self.dataset_kwargs or None,
        }


@dataclass
class LocalJob:
    records: list[dict[str, Any]]
    ranks: int
    summary: str


def _check_inputs(profile: ModelProfile, plan: Plan, options: TrainingOptions) -> TrainingOptions:
    """Fail here, in one line, rather than in every rank: the text file, the user dataset."""
    if options.data:
        from hetplan.models import resolve_model
        from hetplan.runtime.textdata import batches_for

        data = str(Path(options.data).resolve())
        batches_for(profile.model, resolve_model(profile.model), data)
        options = TrainingOptions(**{**options.__dict__, "data": data})
    if options.dataset:
        from hetplan.runtime.dataset import check_dataset

        check_dataset(
            profile.model, options.dataset, options.dataset_kwargs, global_batch=plan.global_batch, seed=options.seed
        )
    return options


def add_stragglers(config: dict[str, Any], stragglers: Sequence[Straggler], *, emulate: bool) -> None:
    """Write each ``--straggler DEVICE:FACTORx@STEP`` into the rank config's device entry (its
    ``slowdown_changes``); a device the plan does not use, or no ``--emulate``, is a one-line error."""
    if stragglers and not emulate:
        raise HetplanError("stragglers are emulation: add --emulate", field="--straggler")
    entries = {d["address"]: d for d in config["devices"]}
    for s in stragglers:
        entry = entries.get(s.device)
        if entry is None:
            raise HetplanError(
                f"device {s.device} is not in the plan (its devices: {', '.join(entries)})", field="--straggler"
            )
        schedule = SlowdownSchedule(entry["emulated_slowdown"], tuple(map(tuple, entry.get("slowdown_changes", []))))
        # the factor is relative to the device's base type, as the cluster's emulated slowdowns are
        entry["slowdown_changes"] = [list(c) for c in schedule.with_change(s.step, s.factor).changes]


def train_here(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    *,
    steps: int,
    options: TrainingOptions,
    emulate: bool = False,
    log: str | None = None,
    save: str | None = None,
    save_every: int | None = None,
    keep_last: int | None = None,
    resume: str | None = None,
    resume_step: int | None = None,
    threads: int = 1,
    progress: Callable[[int, int], None] | None = None,
    stragglers: Sequence[Straggler] = (),
) -> LocalJob:
    """Train ``steps`` steps of ``plan`` with every rank on this machine (gloo); ``stragglers``
    (emulation, with ``emulate``) make a device slower from a step on."""
    from hetplan.runtime.launcher import launch_local

    options = _check_inputs(profile, plan, options)
    config = build_rank_config(plan, profile, cluster, backend="gloo", **options.rank_config_kwargs())
    add_stragglers(config, stragglers, emulate=emulate)
    folder = Path(tempfile.mkdtemp(prefix="hetplan-launch-"))
    try:
        write_yaml(config, folder / "rank-config.yaml")
        result = launch_local(
            folder / "rank-config.yaml",
            steps=steps,
            log=log,
            emulate=emulate,
            save=save,
            save_every=save_every,
            keep_last=keep_last,
            resume=resume,
            resume_step=resume_step,
            threads=threads,
            progress=progress,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ranks = len(config["devices"])
    losses = [r["loss"] for r in result.records if r["rank"] == 0]
    steps_seen = sorted({r["step"] for r in result.records})
    iters = sorted(max(r["iteration_s"] for r in result.records if r["step"] == s) for s in steps_seen)
    median = iters[len(iters) // 2] if iters else float("nan")
    label = " (EMULATED device speeds)" if emulate else ""
    summary = (
        f"trained {len(losses)} steps on {ranks} ranks{label}: loss {losses[0]:.4f} -> {losses[-1]:.4f}; "
        f"median iteration {median * 1e3:.1f} ms ({plan.global_batch / median:.1f} samples/s); predicted "
        f"{plan.predicted.get('iteration_s', float('nan')) * 1e3:.1f} ms"
    )
    return LocalJob(records=result.records, ranks=ranks, summary=summary)

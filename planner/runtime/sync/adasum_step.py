"""``OPT`` under Adasum with an adaptive optimizer: each pipeline steps on its own gradient, the
parameter changes are combined by Adasum (Horovod's ``DistributedOptimizer(op=Adasum)``).

    opt = AdasumOptStep.create(executor, rank_of)   # None unless sync adasum with momentum/adam/adamw
    opt.run(executor, step, stats, where)           # in place of the all-reduce step

Why not on gradients: Adam divides by a running second moment, so the Adasum of two gradients fed
to one Adam is not the Adasum of the two updates Adam would make (Maleki et al. 2021, section 4;
Horovod applies it to ``new - old`` after each rank's local step for that reason). With SGD the
update is ``-lr g`` and Adasum is scale-equivariant, so gradients are combined as before.

The step: the gradient groups have summed only inside each pipeline (a replicated stage;
:meth:`hetplan.runtime.sync.adasum.AdasumTree.pipeline_sum`), so a rank's gradients are its pipeline's.
One job-wide all-reduce carries [loss, overflow count, each pipeline's squared gradient norm]
(every pipeline's holders count their parameters once, in the pipeline's slot); each pipeline clips
by its own norm and steps its own optimizer on its mean gradient; then the deltas are combined per
gradient group, tensor by tensor, up the tree, and every holder sets ``old + combined``
(:class:`hetplan.runtime.sync.adasum.AdasumDeltas`). An overflow anywhere skips the step on every rank
(the count is job-wide) and backs the scaler off, as the all-reduce path does. Each pipeline's
optimizer state stays its own (as each Horovod rank's does).

Refused (one line, exit 2): ZeRO-1 (the state is sharded over holders of different pipelines),
tensor parallelism and tied parameters (their norms and sums cross pipelines differently).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from hetplan.errors import HetplanError
from hetplan.runtime.comm import wait
from hetplan.runtime.nonfinite import nonfinite_what
from hetplan.runtime.optim import clip_coefficient
from hetplan.runtime.sync.adasum import AdasumDeltas

__all__ = ["ADAPTIVE", "AdasumOptStep"]

#: The optimizers whose parameter changes (not gradients) Adasum combines.
ADAPTIVE = ("momentum", "adam", "adamw")


class AdasumOptStep:
    """This rank's side of the Adasum-on-deltas step (see the module doc)."""

    def __init__(self, counted: list[torch.nn.Parameter], deltas: AdasumDeltas, pipeline: int, n_pipelines: int):
        self.counted = counted
        self.deltas = deltas
        self.pipeline = pipeline
        self.n_pipelines = n_pipelines

    @classmethod
    def create(cls, ex: Any, rank_of: dict[str, int]) -> AdasumOptStep | None:
        cfg = ex.config
        if cfg.plan.sync != "adasum" or cfg.optimizer not in ADAPTIVE:
            return None
        why = (
            "ZeRO-1" if ex.zero else "tensor parallelism" if ex.tp is not None else
            "tied parameters" if any(ex.tied.owns(p) for p in ex.params) else None
        )  # fmt: skip
        if why is not None:
            raise HetplanError(
                f"sync adasum with optimizer {cfg.optimizer} combines each pipeline's parameter changes "
                f"and does not support {why} yet; use optimizer sgd or another sync mode",
                field="sync",
            )
        mine = ex.program.pipeline
        counted: list[torch.nn.Parameter] = []
        grouped: set[int] = set()
        groups = {}
        for gid in sorted(ex.groups):
            pg, held = ex.groups[gid]
            grouped.update(id(p) for p in held)
            local = [a for a in ex._group_devices[gid] if cfg.devices[a].pipeline == mine]
            if min(local, key=rank_of.__getitem__) == ex.address:
                counted += held  # the lowest holder of this pipeline counts the group's parameters
            weights = [(ex.precision.master_of(p), p) for p in held]
            groups[gid] = (ex.group_sync.tree(gid, pg), pg, weights)
        counted += [p for p in ex.params if id(p) not in grouped]  # held by this device alone
        order = {id(p): i for i, p in enumerate(ex.params)}
        counted.sort(key=lambda p: order[id(p)])
        return cls(counted, AdasumDeltas(groups), mine, len(cfg.plan.pipelines))

    def run(self, ex: Any, step: int, stats: Any, where) -> None:
        """The whole ``OPT``: loss, overflow and per-pipeline norms, the local step, the deltas' Adasum."""
        cfg, precision = ex.config, ex.precision
        scale = precision.scaler.scale
        vec = torch.zeros(2 + self.n_pipelines, dtype=torch.float64, device=ex.device)
        vec[0] = stats.loss_sum
        vec[1] = float(precision.nonfinite() + ex._sent_nonfinite)
        ex._sent_nonfinite = 0
        vec[2 + self.pipeline] = precision.grad_sq_sum(self.counted).to(ex.device)
        wait(dist.all_reduce(vec, async_op=True), timeout_s=cfg.timeout_s, what=where("the loss all-reduce"))
        stats.loss_sum = float(vec[0]) / cfg.global_batch
        overflow = int(vec[1])
        to_mean = cfg.global_batch / cfg.plan.pipelines[self.pipeline].batch  # the pipeline's mean gradient
        norm = math.sqrt(float(vec[2 + self.pipeline])) * to_mean / scale
        stats.nonfinite = nonfinite_what(stats.loss_sum, norm, scaled=precision.scaler.enabled)
        overflow += stats.nonfinite is not None
        coef = (clip_coefficient(norm, cfg.clip_grad_norm) if overflow == 0 else 1.0) * to_mean
        lr = ex.lr_schedule.lr_at(step)
        precision.set_lr(lr)
        if overflow == 0:
            self.deltas.before()
        stats.skipped = not ex._holding_turn(lambda: precision.step(nonfinite_anywhere=overflow, clip_coef=coef), stats)
        if stats.skipped:
            self.deltas.discard()
        else:
            self.deltas.after(timeout_s=cfg.timeout_s, what=where("the Adasum of the parameter changes"))
        stats.log = {"lr": lr, "grad_norm": norm if math.isfinite(norm) else None}

"""Single-process reference training: the whole global batch, one process, same model and optimizer.

One runtime step must equal one step of this: within float32 rounding for fp32 plans; for fp16 and
bf16 plans, in the same precision (half-precision weights under autocast, fp32 master weights and
optimizer state, the same loss scaling), within the tolerance docs/runtime.md states, since the
runtime adds up per-micro-batch gradients where this takes one backward over the whole batch.

It reads the same samples in the same order as the runtime (positions ``[0, B)`` of each step's
global batch, :mod:`hetplan.runtime.data`), and clips with torch's own
``torch.nn.utils.clip_grad_norm_`` on the unscaled gradients, so a test against it checks the
runtime's norm across ranks, not the same code twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from hetplan.contracts.lr_schedule import LrSchedule
from hetplan.models import resolve_model
from hetplan.runtime.data import open_samples
from hetplan.runtime.precision import Precision, run_blocks
from hetplan.runtime.sync.adasum import weighted_adasum_tree

__all__ = ["train_reference"]


def train_reference(
    model: dict,
    *,
    global_batch: int,
    optimizer: str,
    lr: float,
    seed: int,
    steps: int,
    start_step: int = 0,
    blocks: list[torch.nn.Module] | None = None,
    data: str | None = None,
    dtype: str = "fp32",
    dataset: str | None = None,
    dataset_kwargs: Mapping[str, Any] | None = None,
    weight_decay: float | None = None,
    clip_grad_norm: float | None = None,
    lr_schedule: LrSchedule | None = None,
    history: list[dict[str, Any]] | None = None,
    adasum_batches: Sequence[int] | None = None,
) -> tuple[list[float], list[torch.nn.Module]]:
    """Losses (mean over the global batch) per step, and the trained blocks.

    ``history``, when given, receives per step what the run log records: ``lr``, ``grad_norm``
    (before clipping; None when not finite) and ``clipped``. ``adasum_batches`` (the pipelines'
    batches, in plan order; fp32) makes the step's gradient the Adasum of the pipelines' mean
    gradients, parameter by parameter, weighted by batch (:mod:`hetplan.runtime.sync.adasum`), each
    pipeline's computed by one backward over its own rows of the global batch.
    """
    if adasum_batches is not None and (dtype != "fp32" or sum(adasum_batches) != global_batch):
        raise ValueError(f"an Adasum reference needs fp32 and batches summing to {global_batch}")
    zoo = resolve_model(model)
    samples = open_samples(
        model,
        zoo,
        global_batch=global_batch,
        seed=seed,
        data=data,
        dataset=dataset,
        dataset_kwargs=dataset_kwargs,
    )
    schedule = lr_schedule or LrSchedule(lr)
    blocks = blocks or zoo.build_blocks(0, zoo.n_blocks, seed)
    Precision.cast_model(blocks, dtype)
    params = list({id(p): p for b in blocks for p in b.parameters()}.values())  # a tied parameter once
    precision = Precision(dtype, params, optimizer=optimizer, lr=lr, weight_decay=weight_decay)
    device = params[0].device if params else torch.device("cpu")
    losses = []
    for step in range(start_step, start_step + steps):
        precision.zero_grad()
        if adasum_batches is not None:
            loss = _adasum_backward(zoo, blocks, params, samples.step(step), adasum_batches, global_batch)
        else:
            inputs, targets = samples.step(step).rows(0, global_batch)
            with precision.autocast(device):
                x = run_blocks(blocks, inputs, precision.torch_dtype)
                loss = zoo.loss(x.float(), targets) / global_batch
            precision.scale(loss).backward()
        for p in params:
            precision.accumulate_one(p)
        nonfinite = precision.nonfinite()
        norm = math.nan
        if nonfinite == 0:
            precision.unscale_()  # the optimizer's gradients, unscaled (fp16), then clipped in place
            limit = clip_grad_norm if clip_grad_norm is not None else math.inf
            norm = float(torch.nn.utils.clip_grad_norm_(precision.master, limit, foreach=False))
        lr_now = schedule.lr_at(step)
        precision.set_lr(lr_now)
        precision.step(nonfinite_anywhere=nonfinite)
        losses.append(float(loss.detach()))
        if history is not None:
            record: dict[str, Any] = {"lr": lr_now, "grad_norm": norm if math.isfinite(norm) else None}
            if clip_grad_norm is not None:
                record["clipped"] = math.isfinite(norm) and clip_grad_norm / (norm + 1e-6) < 1.0
            history.append(record)
    return losses, blocks


def _adasum_backward(zoo, blocks, params, batch, batches: Sequence[int], global_batch: int) -> torch.Tensor:
    """Leave in each ``p.grad`` the Adasum of the pipelines' mean gradients; return the whole loss."""
    per_pipeline: list[list[torch.Tensor]] = []
    total = torch.zeros(())
    lo = 0
    for b in batches:
        for p in params:
            p.grad = None
        inputs, targets = batch.rows(lo, lo + b)
        loss = zoo.loss(run_blocks(blocks, inputs, torch.float32).float(), targets) / global_batch
        loss.backward()
        # (b / B) x this pipeline's mean gradient -> its mean gradient
        per_pipeline.append(
            [(p.grad if p.grad is not None else torch.zeros_like(p)) * (global_batch / b) for p in params]
        )
        total = total + loss.detach()
        lo += b
    for i, p in enumerate(params):
        p.grad = weighted_adasum_tree([g[i].flatten() for g in per_pipeline], list(batches)).view_as(p)
    return total

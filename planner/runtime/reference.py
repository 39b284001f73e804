"""Single-process reference training: the whole global batch, one process, same model and optimizer.

One runtime step must equal one step of this: within float32 rounding for fp32 plans; for fp16 and
bf16 plans, in the same precision (half-precision weights under autocast, fp32 master weights and
optimizer state, the same loss scaling), within the tolerance docs/runtime.md states, since the
runtime adds up per-micro-batch gradients where this takes one backward over the whole batch.
"""

from __future__ import annotations

import torch

from planner.models import resolve_model
from planner.runtime.precision import Precision, run_blocks
from planner.runtime.textdata import batches_for

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
) -> tuple[list[float], list[torch.nn.Module]]:
    """Losses (mean over the global batch) per step, and the trained blocks."""
    zoo = resolve_model(model)
    batches = batches_for(model, zoo, data)
    blocks = blocks or zoo.build_blocks(0, zoo.n_blocks, seed)
    Precision.cast_model(blocks, dtype)
    params = [p for b in blocks for p in b.parameters()]
    precision = Precision(dtype, params, optimizer=optimizer, lr=lr)
    device = params[0].device if params else torch.device("cpu")
    losses = []
    for step in range(start_step, start_step + steps):
        inputs, targets = batches.sample_batch(global_batch, seed=seed, step=step)
        precision.zero_grad()
        with precision.autocast(device):
            x = run_blocks(blocks, inputs, precision.torch_dtype)
            loss = zoo.loss(x.float(), targets) / global_batch
        precision.scale(loss).backward()
        for p in params:
            precision.accumulate_one(p)
        precision.step(nonfinite_anywhere=precision.nonfinite())
        losses.append(float(loss.detach()))
    return losses, blocks

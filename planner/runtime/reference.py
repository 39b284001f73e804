"""Single-process reference training: the whole global batch, one process, same model and optimizer.

One runtime step must equal one step of this, within float32 rounding.
"""

from __future__ import annotations

import torch

from planner.models import resolve_model
from planner.runtime.optim import make_optimizer
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
) -> tuple[list[float], list[torch.nn.Module]]:
    """Losses (mean over the global batch) per step, and the trained blocks."""
    zoo = resolve_model(model)
    batches = batches_for(model, zoo, data)
    blocks = blocks or zoo.build_blocks(0, zoo.n_blocks, seed)
    params = [p for b in blocks for p in b.parameters()]
    opt = make_optimizer(optimizer, params, lr)
    losses = []
    for step in range(start_step, start_step + steps):
        inputs, targets = batches.sample_batch(global_batch, seed=seed, step=step)
        x = inputs
        for b in blocks:
            x = b(x)
        loss = zoo.loss(x, targets) / global_batch
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, blocks

"""The learning rate of each step: linear warm-up, then cosine decay to a floor.

    schedule = LrSchedule(lr=1e-3, warmup_steps=100, decay_steps=900, min_lr=1e-5)
    schedule.lr_at(step)        # the rate step ``step`` (0-based, the run's step number) uses

With ``W`` warm-up steps, ``T`` decay steps, peak ``lr`` and floor ``min_lr`` (``m = min_lr / lr``)::

    factor(k) = k / W                                             for k < W
              = m + (1 - m) * (1 + cos(pi * min(1, (k - W) / T))) / 2   for k >= W  (T > 0)
              = 1                                                 for k >= W  (T = 0: constant)
    lr_at(k)  = lr * factor(k)

So step 0 of a warm-up trains at rate 0 (as ``transformers.get_cosine_schedule_with_warmup``),
step ``W`` at ``lr``, step ``W + T`` and every later one at ``min_lr``. ``factor`` is the lambda of
``torch.optim.lr_scheduler.LambdaLR``; with it, LambdaLR gives these very rates (tests check).

The rate is a pure function of the step number, not a scheduler object with state: every rank
computes it alike, and a run resumed from a checkpoint at step ``k`` continues the schedule at
step ``k`` with nothing to save.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["LrSchedule"]


@dataclass(frozen=True)
class LrSchedule:
    """Warm-up and cosine decay around a peak rate; the defaults are a constant ``lr``."""

    lr: float
    warmup_steps: int = 0
    decay_steps: int = 0
    min_lr: float = 0.0

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.warmup_steps < 0 or self.decay_steps < 0 or not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"a schedule needs lr > 0, steps >= 0 and 0 <= min_lr <= lr, got {self}")

    @property
    def constant(self) -> bool:
        return self.warmup_steps == 0 and self.decay_steps == 0

    def factor(self, step: int) -> float:
        """The multiple of ``lr`` that step ``step`` uses (``LambdaLR``'s lambda)."""
        if step < self.warmup_steps:
            return step / self.warmup_steps
        if self.decay_steps == 0:
            return 1.0
        floor = self.min_lr / self.lr
        progress = min(1.0, (step - self.warmup_steps) / self.decay_steps)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step``."""
        return self.lr * self.factor(step)

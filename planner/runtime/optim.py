"""Optimizers by name and the global-norm clipping factor: the same in every rank and in the reference.

    optimizer = make_optimizer("adamw", params, lr=1e-3, weight_decay=0.01)
    coef = clip_coefficient(norm, max_norm=1.0)     # multiply every gradient by this before stepping

The optimizer names are the plan contract's (:data:`hetplan.contracts.plan.OPTIMIZERS`): the plan, the
rank config and this module share one list (AdamW holds Adam's state and moves Adam's bytes per step,
so the planner prices it as Adam).
"""

from __future__ import annotations

import math

import torch

from hetplan.contracts.plan import OPTIMIZERS

__all__ = ["CLIP_EPS", "DEFAULT_WEIGHT_DECAY", "OPTIMIZERS", "clip_coefficient", "make_optimizer"]

#: AdamW's decoupled weight decay when the rank config gives none: ``torch.optim.AdamW``'s default.
DEFAULT_WEIGHT_DECAY = 0.01

#: Added to the norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does (no division by 0).
CLIP_EPS = 1e-6


def make_optimizer(
    name: str, params: list[torch.nn.Parameter], lr: float, *, weight_decay: float | None = None
) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``params``; ``weight_decay`` is AdamW's (default 0.01)."""
    # foreach=False: the per-parameter loop gives bit-identical updates however the parameters are
    # grouped across ranks (the multi-tensor path may batch them differently)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=False)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, foreach=False)
    if name == "adamw":
        decay = DEFAULT_WEIGHT_DECAY if weight_decay is None else weight_decay
        return torch.optim.AdamW(params, lr=lr, weight_decay=decay, foreach=False)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, foreach=False)
    raise ValueError(f"unknown optimizer {name!r} (known: {', '.join(OPTIMIZERS)})")


def clip_coefficient(norm: float, max_norm: float | None) -> float:
    """The factor every gradient is multiplied by: ``min(1, max_norm / (norm + 1e-6))``.

    The formula of ``torch.nn.utils.clip_grad_norm_``, applied to the norm of the whole model's
    gradient so that clipping across ranks equals clipping in one process. No clipping (1.0) when
    ``max_norm`` is None or the norm is not finite (an fp16 overflow skips the step anyway).
    """
    if max_norm is None or not math.isfinite(norm):
        return 1.0
    return min(1.0, max_norm / (norm + CLIP_EPS))

"""Optimizers by name: the same classes and settings in every rank and in the single-process reference."""

from __future__ import annotations

import torch

__all__ = ["make_optimizer"]


def make_optimizer(name: str, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer:
    # foreach=False: the per-parameter loop gives bit-identical updates however the parameters are
    # grouped across ranks (the multi-tensor path may batch them differently)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, foreach=False)
    if name == "momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9, foreach=False)
    return torch.optim.Adam(params, lr=lr, foreach=False)

"""Point-to-point transfers and collectives with a timeout, each failure naming what it waited on."""

from __future__ import annotations

import re
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["RankFailureError", "tag_of", "wait"]


class RankFailureError(Exception):
    """A rank could not go on: names the rank, the step and the action it was waiting on."""


def tag_of(micro: int, grad: bool) -> int:
    """Distinct tags per micro-batch and direction, so messages between one pair never mix."""
    return micro * 2 + (1 if grad else 0)


def wait(work: dist.Work, *, timeout_s: float, what: str) -> None:
    try:
        work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError as exc:  # a timeout or a peer that went away
        text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", str(exc)).strip()
        first = text.splitlines()[0] if text else type(exc).__name__
        raise RankFailureError(f"{what}: {first[:120]}") from None


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)

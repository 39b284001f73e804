"""Point-to-point transfers and collectives with a timeout, each failure naming what it waited on."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["RankFailureError", "failure_text", "tag_of", "use_device", "wait", "waiting_on"]


class RankFailureError(Exception):
    """A rank could not go on: names the rank, the step and the action it was waiting on."""


def tag_of(micro: int, grad: bool) -> int:
    """Distinct tags per micro-batch and direction, so messages between one pair never mix."""
    return micro * 2 + (1 if grad else 0)


#: What the host does once a work has been waited on: the rank's :meth:`DeviceOps.settle`
#: (:func:`use_device`). Under NCCL ``work.wait()`` makes the compute stream wait and returns at once;
#: settling blocks the host until the collective has really completed, so the time a caller records
#: after :func:`wait` is its completion. Nothing on CPU.
_settle: Callable[[], None] = lambda: None  # noqa: E731 - replaced by use_device


def use_device(settle: Callable[[], None]) -> None:
    """Settle every later :func:`wait` on the rank's device (the worker calls this once)."""
    global _settle
    _settle = settle


#: What this process is blocked on now (set by :func:`wait` while it waits, else None). A rank
#: stopped from outside while it waits names it (:mod:`hetplan.runtime.worker`): "waiting on
#: SA1>n0/1" tells a user where the survivors of a failed run were, where "training" does not.
_waiting_on: str | None = None


def waiting_on() -> str | None:
    """The ``what`` of the :func:`wait` this process is blocked in, or None."""
    return _waiting_on


def wait(work: dist.Work, *, timeout_s: float, what: str) -> None:
    global _waiting_on
    _waiting_on = what
    try:
        work.wait(timeout=timedelta(seconds=timeout_s))
        _settle()
    except RuntimeError as exc:  # a timeout or a peer that went away
        raise RankFailureError(f"{what}: {failure_text(exc)}") from None
    finally:
        _waiting_on = None


def failure_text(exc: BaseException) -> str:
    """A collective's error in one whole line: without gloo's source locations, and without its
    closing advice to check the remote worker's logs (the launcher names the rank logs itself)."""
    text = re.sub(r"\[[^\]]*\.(cc|cpp|h):\d+\]\s*", "", str(exc)).strip()
    first = text.splitlines()[0].strip() if text else ""
    first = re.split(r"\s*Check the logs of the remote worker", first)[0].strip()
    return first or type(exc).__name__


def empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)

"""What a user's factory may return besides its blocks: the loss, a sample, a tensor-parallel plan.

    from hetplan.models.spec import ModelSpec

    def build(vocab=64, hidden=32):
        blocks = [nn.Embedding(vocab, hidden), MyLayer(hidden), nn.Linear(hidden, vocab)]
        return ModelSpec(
            blocks,
            loss=lambda logits, target: F.cross_entropy(logits.flatten(0, 1), target.flatten()),
            reduction="mean",                          # the loss above averages over the batch
            sample=lambda g: (ids := torch.randint(0, vocab, (16,), generator=g), ids.roll(-1)),
        )

Why a loss needs its reduction: the runtime splits a global batch into micro-batches and shares of
different sizes on different devices, and each share's gradient must carry its samples' weight
exactly. hetplan therefore works with the SUM over samples (:meth:`~hetplan.models.base.ZooModel.loss`):
a ``"mean"`` loss is multiplied by the number of samples it was given, a ``"sum"`` loss is taken as
it is. A ``"mean"`` loss that averages over tokens as well (cross-entropy over ``[B, T]``) is a sum
of per-sample means only when every sample has the same number of tokens counted: true for fixed
sequence lengths without ignored positions.

``sample(generator) -> (input, target)`` draws ONE synthetic sample (no batch dimension) from the
CPU generator it is given: what the profiler measures with, what ``launch`` trains on without a
``--dataset``, and what a dataset's samples are checked against (shapes and dtypes; the input of
integer dtype is passed to the first block as it is, e.g. token ids).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from hetplan.errors import HetplanError

__all__ = ["REDUCTIONS", "ModelSpec", "summed_loss"]

#: What a user's loss returns over the samples of its batch.
REDUCTIONS = ("mean", "sum")

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SampleFn = Callable[[torch.Generator], tuple[Any, Any]]


@dataclass
class ModelSpec:
    """A factory's model: its blocks in order and, optionally, how to train it.

    Args:
        blocks: an ``nn.Sequential`` (its child names become the block names) or a list of modules;
            each takes one tensor and returns one tensor whose first dimension is the batch.
        loss: ``loss(output, target) -> scalar`` on the last block's output (None: hetplan's own
            synthetic task picks one, as for a factory returning bare blocks).
        reduction: ``"mean"`` or ``"sum"``, what ``loss`` does over the batch.
        sample: ``sample(generator) -> (input, target)``, one sample; required with ``loss``.
        tp_plan: ``{"<block>.<module path>": "colwise" | "rowwise"}`` (``*`` matches one name), the
            tensor-parallel plan of the blocks (:mod:`hetplan.runtime.parallel.tensor_parallel`).
    """

    blocks: nn.Sequential | Sequence[nn.Module]
    loss: LossFn | None = None
    reduction: str = "mean"
    sample: SampleFn | None = None
    tp_plan: Mapping[str, str] | None = field(default=None)


def summed_loss(
    loss: LossFn, reduction: str, output: torch.Tensor, target: torch.Tensor, *, where: str
) -> torch.Tensor:
    """``loss(output, target)`` as the SUM over the batch's samples, checked to be a scalar.

    Raises:
        HetplanError: at ``factory``, naming ``where``, when the loss fails or is not a scalar.
    """
    try:
        value = loss(output, target)
    except Exception as exc:  # user code
        text = str(exc).strip().splitlines()
        reason = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
        raise HetplanError(f"{where}: the loss failed ({reason})", field="factory") from exc
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        got = f"shape {list(value.shape)}" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"
        raise HetplanError(f"{where}: the loss returned {got}; expected a scalar tensor", field="factory")
    value = value.float()
    return value * output.shape[0] if reduction == "mean" else value


def check_reduction(reduction: Any, *, where: str) -> str:
    """``reduction`` if it is one of :data:`REDUCTIONS`; a one-line error otherwise."""
    if reduction not in REDUCTIONS:
        raise HetplanError(f"{where}: reduction is {reduction!r}; expected 'mean' or 'sum'", field="factory")
    return reduction

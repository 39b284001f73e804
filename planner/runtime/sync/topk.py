"""Top-k gradient sparsification with error feedback (Stich et al., 2018; Lin et al., 2018, "DGC").

    compressor = TopK(ratio=0.01)
    idx, val = compressor.compress("layer0.w", grad)    # what this rank sends; the rest is kept
    dense = densify([(idx0, val0), (idx1, val1)], grad.numel())  # what every rank adds up

Each rank adds the residual it kept from earlier steps to its new gradient, sends only the ``k``
largest entries by magnitude (``k = ceil(ratio * numel)``, at least 1) as (indices, values), and keeps
the rest as the next residual: nothing is ever dropped, only delayed (error feedback), which is what
keeps sparsified SGD converging. Every rank gathers every rank's (indices, values) and sums them into a
dense gradient in rank order (so every rank holds the same bits). With ``ratio = 1`` the same
selection and feedback run (there is no dense shortcut): every entry is selected, the residual is
zero, and the result is the plain sum, i.e. the all-reduce.

**Non-finite values never enter the residual.** When the gradient plus residual holds an inf or a
NaN (an fp16 overflow, a diverging step), the selection puts the non-finite entries first (so every
rank's combined gradient shows them, and the step is skipped everywhere, as the all-reduce's is) and
the residual is left as it was before the step. :meth:`TopK.rollback` also restores the residuals
of a step that was skipped for another rank's overflow: a skipped step discards its gradient
everywhere, as the all-reduce path does, and what the residual held before it is still owed.

**Checkpoints.** :meth:`TopK.state_dict` is the residual per name; the runtime saves it per device
(:func:`hetplan.runtime.checkpoint.residual_state`) and a resumed run continues with it, so a
resumed run equals an uninterrupted one.

Ties in magnitude are broken by index (``torch.topk`` on CPU is not documented to be stable, so the
selection sorts explicitly): every run selects the same entries. Every tensor is made on the
gradient's device (NCCL gathers only CUDA tensors): the indices, the dense sum, a restored residual.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["TopK", "densify"]


class TopK:
    """Top-k selection with an error-feedback residual per named tensor.

    Holds, per name, the residual (``numel`` values) and, between :meth:`compress` and the next
    :meth:`commit`/:meth:`compress`, the previous residual (for :meth:`rollback`).
    """

    def __init__(self, ratio: float) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"top-k ratio must be in (0, 1], got {ratio}")
        self.ratio = ratio
        self.residual: dict[str, torch.Tensor] = {}
        self._previous: dict[str, torch.Tensor | None] = {}

    def k_of(self, numel: int) -> int:
        return max(1, min(numel, math.ceil(self.ratio * numel)))

    def compress(self, name: str, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The (int64 indices, values) of ``grad`` + residual to send; the rest becomes the residual."""
        flat = grad.detach().flatten()
        old = self.residual.get(name)
        if old is not None:
            flat = flat + old.to(device=flat.device, dtype=flat.dtype)  # a restored one may be on the host
        k = self.k_of(flat.numel())
        finite = torch.isfinite(flat)
        # largest magnitude first, non-finite before everything, ties by the lower index: a stable sort
        key = torch.where(finite, -flat.abs(), torch.full_like(flat, -math.inf))
        order = torch.sort(key, stable=True).indices[:k]
        idx = torch.sort(order).values
        values = flat[idx].clone()
        self._previous[name] = old
        if bool(finite.all()):
            rest = flat if old is not None else flat.clone()  # ``flat`` is a new tensor when added to
            rest[idx] = 0
            self.residual[name] = rest
        return idx, values

    def commit(self) -> None:
        """The step was taken: forget the previous residuals."""
        self._previous.clear()

    def rollback(self) -> None:
        """The step was skipped everywhere: every residual back to what it was before the step."""
        for name, old in self._previous.items():
            if old is None:
                self.residual.pop(name, None)
            else:
                self.residual[name] = old
        self._previous.clear()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().clone() for k, v in self.residual.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.residual = {k: v.clone() for k, v in state.items()}
        self._previous.clear()


def densify(parts: Sequence[tuple[torch.Tensor, torch.Tensor]], numel: int) -> torch.Tensor:
    """The sum of every rank's sparse (indices, values), dense, added in the given (rank) order."""
    if not parts:
        raise ValueError("nothing to densify")
    out = torch.zeros(numel, dtype=parts[0][1].dtype, device=parts[0][1].device)
    for idx, values in parts:
        out.index_add_(0, idx, values)
    return out

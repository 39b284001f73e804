"""Top-k gradient sparsification with error feedback (Stich et al., 2018; Lin et al., 2018, "DGC").

    compressor = TopK(ratio=0.01)
    idx, val = compressor.compress("layer0.w", grad)    # what this rank sends; the rest is kept
    dense = densify([(idx0, val0), (idx1, val1)], grad.numel())  # what every rank adds up

Each rank adds the residual it kept from earlier steps to its new gradient, sends only the ``k``
largest entries by magnitude (``k = ceil(ratio * numel)``, at least 1) as (indices, values), and keeps
the rest as the next residual: nothing is ever dropped, only delayed (error feedback), which is what
keeps sparsified SGD converging. Every rank gathers every rank's (indices, values) and sums them into a
dense gradient in rank order (so every rank holds the same bits). With ``ratio = 1`` every entry is
sent and no residual is kept: the result is the plain sum, i.e. the all-reduce.

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
    """Top-k selection with an error-feedback residual per named tensor."""

    def __init__(self, ratio: float) -> None:
        if not 0 < ratio <= 1:
            raise ValueError(f"top-k ratio must be in (0, 1], got {ratio}")
        self.ratio = ratio
        self.residual: dict[str, torch.Tensor] = {}

    def k_of(self, numel: int) -> int:
        return max(1, min(numel, math.ceil(self.ratio * numel)))

    def compress(self, name: str, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The (int64 indices, values) of ``grad`` + residual to send; the rest becomes the residual."""
        flat = grad.detach().flatten()
        if name in self.residual:
            flat = flat + self.residual[name].to(flat.device)  # a restored residual may be on the host
        k = self.k_of(flat.numel())
        if k == flat.numel():
            self.residual.pop(name, None)
            return torch.arange(flat.numel(), dtype=torch.int64, device=flat.device), flat.clone()
        # largest magnitude first, ties by the lower index: a stable sort of -|x|
        order = torch.sort(-flat.abs(), stable=True).indices[:k]
        idx = torch.sort(order).values
        values = flat[idx].clone()
        rest = flat.clone()
        rest[idx] = 0
        self.residual[name] = rest
        return idx, values

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.residual.items()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.residual = {k: v.clone() for k, v in state.items()}


def densify(parts: Sequence[tuple[torch.Tensor, torch.Tensor]], numel: int) -> torch.Tensor:
    """The sum of every rank's sparse (indices, values), dense, added in the given (rank) order."""
    if not parts:
        raise ValueError("nothing to densify")
    out = torch.zeros(numel, dtype=parts[0][1].dtype, device=parts[0][1].device)
    for idx, values in parts:
        out.index_add_(0, idx, values)
    return out

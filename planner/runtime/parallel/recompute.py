"""Activation recomputation of a stage: what its blocks keep for backward.

    run = recomputed(blocks, "full")        # callables to run in place of the blocks
    y = run_blocks(run, x, dtype)

``full`` keeps only each block's input: every block runs under ``torch.utils.checkpoint``
(non-reentrant), its forward run again in backward from that input. ``selective`` keeps the block
but drops the attention core of every attention block (scores, softmax, their product with v; see
:func:`hetplan.models.gpt.attention_core`), the s²-sized activations Megatron's selective
recomputation drops. ``none`` keeps everything.

The result is exact: the recomputed forward runs the same operations on the same inputs, and
``torch.utils.checkpoint`` saves the CPU (and, where used, CUDA) RNG state at the forward and
restores it for the recomputation (``preserve_rng_state=True``, its default), so a dropout draws the
same mask twice. A recomputed tensor-parallel block runs its forward all-reduce again in backward;
every member of the group recomputes at the same point of its action list, so the collectives match.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from hetplan.errors import HetplanError

__all__ = ["RECOMPUTE_MODES", "Recomputed", "recomputed"]

RECOMPUTE_MODES = ("none", "full", "selective")


class Recomputed:
    """Run ``block`` keeping only its input for backward (its forward is run again there)."""

    def __init__(self, block: nn.Module) -> None:
        self.block = block

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.block(x)
        return checkpoint(self.block, x, use_reentrant=False, preserve_rng_state=True)


def recomputed(blocks: Sequence[nn.Module], mode: str) -> list:
    """What to run in place of ``blocks`` under recomputation ``mode`` (the blocks themselves keep
    their parameters and names: checkpoints and optimizers see no wrapper)."""
    if mode not in RECOMPUTE_MODES:
        raise HetplanError(f"expected recompute one of {', '.join(RECOMPUTE_MODES)}, got {mode!r}", field="recompute")
    for b in blocks:
        for m in b.modules():
            if hasattr(m, "recompute_core"):
                m.recompute_core = mode == "selective"
    if mode == "full":
        return [Recomputed(b) for b in blocks]
    return list(blocks)

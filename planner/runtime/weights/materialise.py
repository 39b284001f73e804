"""A rank's blocks, and no others: built from the seed, or shaped on meta and filled from weights.

    blocks = build_rank_blocks(zoo, 4, 8, seed=0)                          # the seeded build
    blocks = build_rank_blocks(zoo, 4, 8, seed=0, init_from="gpt2/")       # meta, then loaded

Why two paths: with a seed, a block's values are its deterministic build (every zoo and Hugging Face
block is built alone from ``(seed, index)``; a factory's blocks through
:mod:`hetplan.models.partial_build`, which allocates only the blocks asked for and gives them the
values a full call of the factory gives them), so the rank's blocks equal the single-process
model's, bit for bit. With weights to start from, drawing random values only to overwrite them
would cost time and memory: the blocks are built on the meta device (shapes, no memory) and take
the tensors read from the source as their own (``load_state_dict(assign=True)``), one block at a
time, so a rank holds its blocks and nothing more. A block with a
buffer that no state dict carries (a non-persistent buffer: a cached mask, a rotary table) cannot
be filled so; it is built from the seed first, then loaded.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hetplan.models.base import share_tied
from hetplan.runtime.weights.init_from import load_blocks, open_weights

__all__ = ["build_rank_blocks"]


def _unsaved_buffers(block: nn.Module) -> bool:
    """Whether ``block`` has a buffer its state dict leaves out (a non-persistent one)."""
    saved = set(block.state_dict())
    return any(name not in saved for name, _ in block.named_buffers())


def build_rank_blocks(zoo: Any, start: int, end: int, seed: int, *, init_from: str | None = None) -> list[nn.Module]:
    """Blocks ``[start, end)`` of ``zoo`` on the CPU, in training mode, tied parameters shared.

    Args:
        zoo: the model (:class:`~hetplan.models.base.ZooModel`).
        seed: the run's seed (the blocks' values without ``init_from``).
        init_from: weights to load instead (:func:`~hetplan.runtime.weights.init_from.open_weights`);
            only these blocks' tensors are read.
    """
    if init_from is None:
        return zoo.build_blocks(start, end, seed)
    with open_weights(init_from) as source:
        with torch.device("meta"):
            shells = zoo.build_blocks(start, end, seed)
        blocks = {
            i: zoo.build_block(i, seed) if _unsaved_buffers(shell) else shell
            for i, shell in zip(range(start, end), shells, strict=True)
        }
        load_blocks(source, zoo, blocks, assign=True)  # the tensors read become the blocks': no copy
        share_tied(zoo.tied_parameters(), blocks)  # each block was given its own copy of a tied one
    return [blocks[i].train() for i in range(start, end)]

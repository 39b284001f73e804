"""Adasum: combine the pipelines' gradients adaptively instead of summing them (Maleki et al., 2021).

    combined = adasum_tree([g0, g1, g2])              # tensors of one parameter, one per pipeline
    inputs = share_weighted_inputs(grads, batches)    # mean gradients scaled for unequal batch shares

For two gradients ``a`` and ``b`` (of one tensor: Adasum works tensor by tensor, as Horovod's does)::

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

Orthogonal gradients add up (``a.b = 0``), identical ones give the gradient once (``a = b``: half of
each), and in between the part they share is counted once: the combination approximates applying
the two updates one after the other, which is what keeps large effective batches converging. A zero
gradient contributes nothing (its coefficient is never evaluated). More than two inputs combine as a
tree, in order: neighbours pairwise, level by level, an odd one out carried to the next level
(Horovod's recursive halving for a power of two; a deterministic order for any count, so every rank
computes the same bits).

**Unequal batch shares.** hetplan's pipelines take batch shares ``b_p`` by their speed. Each
pipeline's input is its *mean* gradient ``g_p`` scaled by ``b_p / b_mean`` (``b_mean = B / n``): a
pipeline that saw twice the samples stands for two updates of the mean size, as two equal pipelines
would. So equal shares give plain Adasum; identical gradients give the gradient (two pipelines:
parallel inputs of lengths ``c1, c2`` combine to ``(c1 + c2) / 2``, the mean, which is 1); orthogonal
ones give ``sum_p (b_p / b_mean) g_p``, the share-weighted sum scaled as Adasum's sum is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["adasum_pair", "adasum_tree", "share_weighted_inputs"]


def adasum_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two gradients of one tensor, computed in float64 for the dot products."""
    a64, b64 = a.double(), b.double()
    dot = torch.dot(a64.flatten(), b64.flatten())
    na, nb = torch.dot(a64.flatten(), a64.flatten()), torch.dot(b64.flatten(), b64.flatten())
    if na == 0:
        return b.clone()
    if nb == 0:
        return a.clone()
    out = (1 - dot / (2 * na)) * a64 + (1 - dot / (2 * nb)) * b64
    return out.to(a.dtype)


def adasum_tree(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """Adasum of any number of gradients of one tensor: pairwise, level by level, in order."""
    if not grads:
        raise ValueError("Adasum needs at least one gradient")
    level = list(grads)
    while len(level) > 1:
        nxt = [adasum_pair(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].clone()


def share_weighted_inputs(mean_grads: Sequence[torch.Tensor], batches: Sequence[int]) -> list[torch.Tensor]:
    """Each pipeline's mean gradient scaled by its batch over the mean batch (see the module doc)."""
    if len(mean_grads) != len(batches) or not batches:
        raise ValueError(f"expected one batch per gradient, got {len(batches)} for {len(mean_grads)}")
    mean = sum(batches) / len(batches)
    return [g * (b / mean) for g, b in zip(mean_grads, batches, strict=True)]

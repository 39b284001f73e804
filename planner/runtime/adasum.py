"""Adasum: combine the pipelines' gradients adaptively instead of summing them (Maleki et al., 2021).

    combined = adasum_tree([g0, g1, g2])              # tensors of one parameter, one per pipeline
    combined = weighted_adasum_tree(means, batches)   # pipelines' mean gradients, weighted by batch share

For two gradients ``a`` and ``b`` (of one tensor: Adasum works tensor by tensor, as Horovod's does)::

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

Orthogonal gradients add up (``a.b = 0``), identical ones give the gradient once (``a = b``: half of
each), and in between the part they share is counted once: the combination approximates applying
the two updates one after the other, which is what keeps large effective batches converging. A zero
gradient contributes nothing (its coefficient is never evaluated). More than two inputs combine as a
tree, in order: neighbours pairwise, level by level, an odd one out carried to the next level
(Horovod's recursive halving for a power of two; a deterministic order for any count, so every rank
computes the same bits).

**Unequal batch shares.** hetplan's pipelines take batch shares ``b_p`` by their speed, so their
mean gradients are not equally sure. :func:`weighted_adasum_tree` combines mean gradients ``g_p``
with weights ``b_p``; each tree node carries its value ``V``, its total weight ``W`` and its number of
leaves ``n``. Two nodes combine as::

    ca = (Wa / na) (n / W),  cb = (Wb / nb) (n / W)           (n = na + nb, W = Wa + Wb)
    V  = ca Va + cb Vb - (Va.Vb) (alpha Va / |Va|^2 + beta Vb / |Vb|^2)
    alpha = (ca + cb - 1) cb / (ca + cb),  beta = (ca + cb - 1) ca / (ca + cb)

which keeps the three properties that define Adasum, for any shares and any number of pipelines:
equal weights give plain Adasum (``ca = cb = 1``, ``alpha = beta = 1/2``); identical gradients give
the gradient (by induction: ``ca + cb - (alpha + beta) = 1``); mutually orthogonal gradients give
``sum_p (b_p / b_mean) g_p``, the share-weighted sum scaled as Adasum's sum is (the correction
vanishes and the coefficients carry each leaf's ``b_p n / W``). Plain :func:`adasum_tree` would
instead let a pipeline's share change the result even when all gradients agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["adasum_pair", "adasum_tree", "weighted_adasum_tree"]


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


def _weighted_pair(
    a: tuple[torch.Tensor, float, int], b: tuple[torch.Tensor, float, int]
) -> tuple[torch.Tensor, float, int]:
    """Combine two tree nodes ``(value, weight, leaves)`` by the rule in the module doc (float64)."""
    (va, wa, na), (vb, wb, nb) = a, b
    n, w = na + nb, wa + wb
    ca, cb = (wa / na) * (n / w), (wb / nb) * (n / w)
    out = ca * va + cb * vb
    dot = torch.dot(va.flatten(), vb.flatten())
    la, lb = torch.dot(va.flatten(), va.flatten()), torch.dot(vb.flatten(), vb.flatten())
    if la > 0 and lb > 0:
        excess = ca + cb - 1.0
        out = out - dot * (excess * cb / (ca + cb) * va / la + excess * ca / (ca + cb) * vb / lb)
    return out, w, n


def weighted_adasum_tree(means: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Adasum of the pipelines' mean gradients of one tensor, weighted by their batch shares."""
    if not means or len(means) != len(weights):
        raise ValueError(f"expected one weight per gradient, got {len(weights)} for {len(means)}")
    if any(w <= 0 for w in weights):
        raise ValueError(f"weights must be positive, got {list(weights)}")
    level = [(g.double(), float(w), 1) for g, w in zip(means, weights, strict=True)]
    while len(level) > 1:
        nxt = [_weighted_pair(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0][0].to(means[0].dtype)

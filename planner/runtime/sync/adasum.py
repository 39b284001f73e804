"""Adasum: combine the pipelines' updates adaptively instead of summing them (Maleki et al., 2021).

    combined = adasum_tree([g0, g1, g2])              # one process: tensors of one parameter
    combined = weighted_adasum_tree(means, batches)   # pipelines' mean gradients, weighted by batch share
    tree = AdasumTree(ranks, pipeline_of_rank, batches, sizes)
    tree.reduce(flat, pg, timeout_s=60)               # every holder of a gradient group, in place

For two updates ``a`` and ``b`` of one tensor (Adasum works tensor by tensor, as Horovod's does: the
dot products are taken per tensor of the fused buffer, Horovod's ``tensor_counts``)::

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

Orthogonal updates add up (``a.b = 0``), identical ones give the update once, and in between the
part they share is counted once: the combination approximates applying the two updates one after the
other. A zero update contributes nothing (its coefficient is never evaluated). More than two inputs
combine as a binary tree in order: neighbours pairwise, level by level, an odd one out carried to the
next level. For a power of two this is Horovod's tree (level ``l`` combines the blocks of ``2^l``
ranks that recursive doubling pairs); for any count it is one deterministic order.

**What is combined** (Horovod's ``DistributedOptimizer(op=Adasum)``): for SGD the gradients; for an
adaptive optimizer (Adam) the parameter *changes*: each pipeline steps its own optimizer on its own
gradient, and the deltas ``new - old`` are combined (:class:`AdasumTree` is the same either way; the
executor chooses what it passes).

**Across ranks** (:class:`AdasumTree`): a gradient group's holders first sum their contributions
inside each pipeline (a replicated stage: point to point to the pipeline's lowest rank, in rank
order), then the pipelines' leaders combine up the tree, the right node sending its vector to the
left one, which combines in place; the root broadcasts the result to every holder. Every rank holds
one receive buffer of the group's size, never ``n`` copies; dot products are float64 scalars, the
vectors stay in their own dtype. Horovod halves the vector at each level (recursive halving, and
all-reduces the partial dot products) to spread the bandwidth; we send whole vectors up a tree of
``ceil(log2 n)`` levels and broadcast: the same arithmetic per tensor, a simpler wire pattern.

**Unequal batch shares.** hetplan's pipelines take batch shares ``b_p`` by their speed, so their
mean gradients are not equally sure. Each tree node carries its value ``V``, its total weight ``W``
and its number of leaves ``n``. Two nodes combine as::

    ca = (Wa / na) (n / W),  cb = (Wb / nb) (n / W)           (n = na + nb, W = Wa + Wb)
    V  = ca Va + cb Vb - (Va.Vb) (alpha Va / |Va|^2 + beta Vb / |Vb|^2)
    alpha = (ca + cb - 1) cb / (ca + cb),  beta = (ca + cb - 1) ca / (ca + cb)

Equal weights give the paper's formula exactly (``ca = cb = 1``, ``alpha = beta = 1/2``); identical
inputs give the input; mutually orthogonal ones give ``sum_p (b_p / b_mean) g_p``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hetplan.runtime.comm import wait

__all__ = [
    "DOT_CHUNK",
    "AdasumDeltas",
    "AdasumTree",
    "adasum_pair",
    "adasum_tree",
    "pair_coefficients",
    "weighted_adasum_tree",
]

#: the tag of Adasum's point-to-point messages (apart from the pipeline transfers and the schedulers')
TAG = (1 << 20) + 3
#: Elements per chunk of the float64 dot products (their workspace: 12 bytes an element of a chunk;
#: priced by the memory walk, ``hetplan.simulate.memory.ADASUM_DOT_CHUNK``, which must equal it)
DOT_CHUNK = 1 << 16


def pair_coefficients(
    dot: float, la: float, lb: float, *, wa: float = 1.0, wb: float = 1.0, na: int = 1, nb: int = 1
) -> tuple[float, float]:
    """``(ka, kb)`` with ``combine(a, b) = ka a + kb b`` by the rule in the module doc (float64 scalars)."""
    n, w = na + nb, wa + wb
    ca, cb = (wa / na) * (n / w), (wb / nb) * (n / w)
    if la <= 0 or lb <= 0:  # a zero update: the other one, scaled as its weight says
        return ca, cb
    excess = ca + cb - 1.0
    return ca - dot * excess * cb / (ca + cb) / la, cb - dot * excess * ca / (ca + cb) / lb


def _dots(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """``a.b, |a|^2, |b|^2`` accumulated in float64 (as Horovod does for float32), over chunks of
    :data:`DOT_CHUNK` elements: a product and its float64 copy (``sum(dtype=float64)`` casts before
    it adds) exist for one chunk at a time, ``12 x min(numel, DOT_CHUNK)`` bytes, never for a whole
    tensor (an embedding's would be 3x its size)."""
    a, b = a.reshape(-1), b.reshape(-1)
    f64 = torch.float64
    dot = la = lb = 0.0
    for lo in range(0, a.numel(), DOT_CHUNK):
        x, y = a[lo : lo + DOT_CHUNK], b[lo : lo + DOT_CHUNK]
        dot += float(torch.mul(x, y).sum(dtype=f64))
        la += float(torch.mul(x, x).sum(dtype=f64))
        lb += float(torch.mul(y, y).sum(dtype=f64))
    return dot, la, lb


def combine_into(
    a: torch.Tensor, b: torch.Tensor, sizes: Sequence[int], *, wa: float, wb: float, na: int, nb: int
) -> torch.Tensor:
    """``a := combine(a, b)`` tensor by tensor over the flat buffers' ``sizes``; returns ``a``."""
    offset = 0
    for size in sizes:
        x, y = a[offset : offset + size], b[offset : offset + size]
        dot, la, lb = _dots(x, y)
        ka, kb = pair_coefficients(dot, la, lb, wa=wa, wb=wb, na=na, nb=nb)
        x.mul_(ka).add_(y, alpha=kb)
        offset += size
    if offset != a.numel():
        raise ValueError(f"tensor sizes cover {offset} of {a.numel()} elements")
    return a


def adasum_pair(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two updates of one tensor (the paper's formula), as a new tensor."""
    return combine_into(a.detach().clone().reshape(-1), b.reshape(-1), [a.numel()], wa=1, wb=1, na=1, nb=1).view_as(a)


def adasum_tree(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """Adasum of any number of updates of one tensor: pairwise, level by level, in order."""
    return weighted_adasum_tree(grads, [1.0] * len(grads))


def weighted_adasum_tree(means: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """Adasum of the pipelines' mean gradients of one tensor, weighted by their batch shares."""
    if not means or len(means) != len(weights):
        raise ValueError(f"expected one weight per gradient, got {len(weights)} for {len(means)}")
    if any(w <= 0 for w in weights):
        raise ValueError(f"weights must be positive, got {list(weights)}")
    size = means[0].numel()
    level = [(g.detach().clone().reshape(-1), float(w), 1) for g, w in zip(means, weights, strict=True)]
    while len(level) > 1:
        nxt = []
        for (va, wa, na), (vb, wb, nb) in zip(level[0:-1:2], level[1::2], strict=True):
            nxt.append((combine_into(va, vb, [size], wa=wa, wb=wb, na=na, nb=nb), wa + wb, na + nb))
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0][0].view_as(means[0])


class AdasumTree:
    """The Adasum of one gradient group's holders, by point to point in the group (see the module doc).

    Args:
        ranks: the group's global ranks, ascending (``dist.get_process_group_ranks``).
        pipeline_of_rank: each of those ranks' pipeline.
        batches: every pipeline's batch (its weight; equal batches give plain Adasum).
        sizes: the sizes of the tensors in the flat buffer, in order (the per-tensor granularity).
    """

    def __init__(
        self,
        ranks: Sequence[int],
        pipeline_of_rank: Sequence[int],
        batches: Mapping[int, int],
        sizes: Sequence[int],
    ) -> None:
        if len(ranks) != len(pipeline_of_rank):
            raise ValueError(f"expected one pipeline per rank, got {len(pipeline_of_rank)} for {len(ranks)}")
        self.sizes = tuple(sizes)
        self.members: dict[int, list[int]] = {}
        for r, p in sorted(zip(ranks, pipeline_of_rank, strict=True)):
            self.members.setdefault(p, []).append(r)
        self.pipelines = sorted(self.members)
        self.batches = {p: batches[p] for p in self.pipelines}
        self.total_batch = sum(batches.values())
        self.root = self.members[self.pipelines[0]][0]

    def reduce(
        self, flat: torch.Tensor, pg: Any, *, timeout_s: float, what: str = "Adasum", mean_scale: bool = True
    ) -> torch.Tensor:
        """Replace ``flat`` (this rank's contribution) by the group's Adasum, in place; every holder
        ends with the same bits. ``mean_scale``: contributions are weighted by samples / global batch,
        summed inside each pipeline and turned into its mean (gradients); False: every holder of a
        pipeline holds the pipeline's value already (its parameter change, the same on its replicas),
        and the pipeline's lowest rank's is combined as given."""
        me = dist.get_rank()
        p = next(q for q, rs in self.members.items() if me in rs)
        leader = self.members[p][0]
        held: list[torch.Tensor] = []  # the one receive buffer, made by a rank that receives

        def recv(src: int) -> torch.Tensor:
            if not held:
                held.append(torch.empty_like(flat))
            wait(dist.irecv(held[0], src=src, group=pg, tag=TAG), timeout_s=timeout_s, what=what)
            return held[0]

        def send(dst: int) -> None:
            wait(dist.isend(flat, dst=dst, group=pg, tag=TAG), timeout_s=timeout_s, what=what)

        # 1. inside a pipeline (a replicated stage): the sum at its lowest rank, in rank order
        if me != leader:
            if mean_scale:
                send(leader)
        else:
            if mean_scale:
                for r in self.members[p][1:]:
                    flat.add_(recv(r))
                flat.mul_(self.total_batch / self.batches[p])
            # 2. the pipelines' leaders, up the tree: the right node sends, the left one combines
            nodes = [(self.members[q][0], float(self.batches[q]), 1) for q in self.pipelines]
            while len(nodes) > 1:
                nxt = []
                for (ra, wa, na), (rb, wb, nb) in zip(nodes[0:-1:2], nodes[1::2], strict=True):
                    if me == ra:
                        combine_into(flat, recv(rb), self.sizes, wa=wa, wb=wb, na=na, nb=nb)
                    elif me == rb:
                        send(ra)
                    nxt.append((ra, wa + wb, na + nb))
                if len(nodes) % 2:
                    nxt.append(nodes[-1])
                nodes = nxt
        held.clear()
        # 3. the root's result to every holder
        if len(self.members) > 1 or len(self.members[p]) > 1:
            wait(dist.broadcast(flat, src=self.root, group=pg, async_op=True), timeout_s=timeout_s, what=what)
        return flat

    def pipeline_sum(self, flat: torch.Tensor, pg: Any, *, timeout_s: float, what: str = "Adasum") -> torch.Tensor:
        """Replace ``flat`` by the sum of its pipeline's holders' (in rank order), in place, on every
        holder of the pipeline: the gradient a pipeline's own optimizer steps on (Adasum on deltas)."""
        me = dist.get_rank()
        ranks = next(rs for rs in self.members.values() if me in rs)
        if len(ranks) == 1:
            return flat
        leader = ranks[0]
        if me != leader:
            wait(dist.isend(flat, dst=leader, group=pg, tag=TAG), timeout_s=timeout_s, what=what)
            wait(dist.irecv(flat, src=leader, group=pg, tag=TAG), timeout_s=timeout_s, what=what)
            return flat
        buf = torch.empty_like(flat)
        for r in ranks[1:]:
            wait(dist.irecv(buf, src=r, group=pg, tag=TAG), timeout_s=timeout_s, what=what)
            flat.add_(buf)
        for r in ranks[1:]:
            wait(dist.isend(flat, dst=r, group=pg, tag=TAG), timeout_s=timeout_s, what=what)
        return flat


class AdasumDeltas:
    """Adasum of the optimizer's parameter changes (Horovod's ``op=Adasum`` with an adaptive optimizer).

        deltas = AdasumDeltas({gid: (tree, pg, weights)})   # weights: what the optimizer updates
        deltas.before()                                     # copy each group's weights
        optimizer.step()                                    # each pipeline on its own gradient
        deltas.after(timeout_s=60)                          # weights = old + Adasum(new - old)

    Holds, between :meth:`before` and :meth:`after`, one copy of each group's weights (``numel``
    fp32) and, during :meth:`after`, one group's delta and the tree's receive buffer; nothing across
    steps. A skipped step (an overflow everywhere) calls :meth:`discard` instead of :meth:`after`.
    """

    def __init__(
        self, groups: Mapping[int, tuple[AdasumTree, Any, Sequence[torch.Tensor | tuple[torch.Tensor, torch.Tensor]]]]
    ) -> None:
        # each weight: the tensor the optimizer updates, or (that, the model's parameter it mirrors:
        # an fp32 master and its fp16 weight)
        self.groups = {
            gid: (tree, pg, [w if isinstance(w, tuple) else (w, w) for w in ws])
            for gid, (tree, pg, ws) in sorted(groups.items())
        }
        self._old: dict[int, torch.Tensor] = {}

    def before(self) -> None:
        self._old = {
            gid: torch.cat([w.detach().float().reshape(-1) for w, _ in ws]) for gid, (_, _, ws) in self.groups.items()
        }

    def discard(self) -> None:
        self._old.clear()

    def after(self, *, timeout_s: float, what: str = "Adasum of the deltas") -> None:
        """Every group in group order: the delta, its Adasum over the pipelines, weights = old + it."""
        with torch.no_grad():
            for gid, (tree, pg, ws) in self.groups.items():
                old = self._old.pop(gid)
                delta = torch.cat([w.detach().float().reshape(-1) for w, _ in ws]).sub_(old)
                tree.reduce(delta, pg, timeout_s=timeout_s, what=what, mean_scale=False)
                old.add_(delta)
                offset = 0
                for w, mirror in ws:
                    w.copy_(old[offset : offset + w.numel()].view_as(w))
                    if mirror is not w:
                        mirror.copy_(w)
                    offset += w.numel()

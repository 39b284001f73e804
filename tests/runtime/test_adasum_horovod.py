"""Adasum across ranks (:class:`hetplan.runtime.sync.adasum.AdasumTree`) on four gloo ranks against the
paper's formula written here, independently of the code under test: two ranks (a process group of
two), four ranks in the tree's order ((0 1) (2 3)), every rank holding the same bits, tensor by tensor;
and Adam on deltas as Horovod applies it (each rank steps its own Adam on its own gradient, the
parameter changes are combined, every rank sets old + combined)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawn_ranks import spawn_ranks

from hetplan.runtime.sync.adasum import AdasumDeltas, AdasumTree

WORLD = 4
SIZES = (6, 3, 5)  # three tensors in one flat buffer: the dot products are taken per tensor


def _update(rank: int) -> torch.Tensor:
    """A rank's update: partly shared with the others (so the dot products are not zero)."""
    shared = torch.randn(sum(SIZES), generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    own = torch.randn(sum(SIZES), generator=torch.Generator().manual_seed(10 + rank), dtype=torch.float64)
    return (0.7 * shared + own).float()


def _paper(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Maleki et al. 2021, eq. (Adasum of two): the reference, per tensor, in float64."""
    out, offset = [], 0
    for size in SIZES:
        x, y = a[offset : offset + size].double(), b[offset : offset + size].double()
        dot = x @ y
        out.append((1 - dot / (2 * (x @ x))) * x + (1 - dot / (2 * (y @ y))) * y)
        offset += size
    return torch.cat(out)


SHAPES = ((2, 3), (3,), (5,))  # the tensors of SIZES
ADAM_STEPS = 3


def _start() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randn(shape, generator=gen) for shape in SHAPES]


def _adam_grad(rank: int, step: int, w: torch.Tensor, i: int) -> torch.Tensor:
    """A rank's own gradient of tensor ``i``: a pull toward its own target (they disagree)."""
    target = torch.randn(w.shape, generator=torch.Generator().manual_seed(1000 * rank + 10 * step + i))
    return w.detach() - target


def _adam_run(rank: int) -> list[torch.Tensor]:
    weights = [w.clone().requires_grad_(True) for w in _start()]
    opt = torch.optim.Adam(weights, lr=0.1)
    tree = AdasumTree(list(range(WORLD)), (0, 1, 2, 3), {p: 2 for p in range(4)}, SIZES)
    deltas = AdasumDeltas({0: (tree, None, weights)})
    for step in range(ADAM_STEPS):
        for i, w in enumerate(weights):
            w.grad = _adam_grad(rank, step, w, i)
        deltas.before()
        opt.step()
        deltas.after(timeout_s=60)
    return [w.detach().clone() for w in weights]


def _run(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        results: dict[str, torch.Tensor] = {}
        pair = dist.new_group([0, 1])  # every rank creates it; only 0 and 1 use it
        if rank in (0, 1):
            tree = AdasumTree([0, 1], (0, 1), {0: 1, 1: 1}, SIZES)
            results["two"] = tree.reduce(_update(rank), pair, timeout_s=60, mean_scale=False).clone()
        tree4 = AdasumTree(list(range(WORLD)), (0, 1, 2, 3), {p: 2 for p in range(4)}, SIZES)
        results["four"] = tree4.reduce(_update(rank), None, timeout_s=60, mean_scale=False).clone()
        # gradients weighted by samples / global batch (2 of 8 each): turned into each pipeline's mean
        grads = tree4.reduce(_update(rank) * 2 / 8, None, timeout_s=60)
        results["four_grads"] = grads.clone()
        results["adam"] = _adam_run(rank)
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("adasum")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    spawn_ranks(_run, args=(f"file://{tmp / 'store'}", str(tmp)), nprocs=WORLD)
    return [torch.load(tmp / f"rank{r}.pt") for r in range(WORLD)]


def test_two_ranks_equal_the_papers_formula(results: list[dict]) -> None:
    expect = _paper(_update(0), _update(1))
    assert torch.allclose(results[0]["two"].double(), expect, atol=1e-5, rtol=0)
    assert torch.equal(results[0]["two"], results[1]["two"])
    # and it is not the sum nor the mean: the shared part is counted once
    assert not torch.allclose(results[0]["two"], _update(0) + _update(1), atol=1e-2)


def test_four_ranks_are_the_formula_in_the_trees_order(results: list[dict]) -> None:
    u = [_update(r) for r in range(WORLD)]
    expect = _paper(_paper(u[0], u[1]), _paper(u[2], u[3]))
    assert torch.allclose(results[0]["four"].double(), expect, atol=1e-5, rtol=0)
    other_order = _paper(_paper(u[0], u[2]), _paper(u[1], u[3]))
    assert not torch.allclose(other_order, expect, atol=1e-4)  # the order is what the test pins
    assert all(torch.equal(r["four"], results[0]["four"]) for r in results)


def test_gradients_are_combined_as_each_pipelines_mean(results: list[dict]) -> None:
    u = [_update(r) for r in range(WORLD)]
    expect = _paper(_paper(u[0], u[1]), _paper(u[2], u[3]))
    assert torch.allclose(results[0]["four_grads"].double(), expect, atol=1e-5, rtol=0)
    assert all(torch.equal(r["four_grads"], results[0]["four_grads"]) for r in results)


def test_adam_on_deltas_as_horovod(results: list[dict]) -> None:
    """The reference: four Adams, each on its own gradient; the deltas combined by the formula in
    the tree's order; every rank's weights set to old + combined (its Adam state stays its own)."""
    weights = [[w.clone().requires_grad_(True) for w in _start()] for _ in range(WORLD)]
    opts = [torch.optim.Adam(ws, lr=0.1) for ws in weights]
    for step in range(ADAM_STEPS):
        old = torch.cat([w.detach().reshape(-1) for w in weights[0]]).clone()
        deltas = []
        for r in range(WORLD):
            for i, w in enumerate(weights[r]):
                w.grad = _adam_grad(r, step, w, i)
            opts[r].step()
            deltas.append(torch.cat([w.detach().reshape(-1) for w in weights[r]]) - old)
        new = (old.double() + _paper(_paper(deltas[0], deltas[1]), _paper(deltas[2], deltas[3]))).float()
        for r in range(WORLD):
            offset = 0
            with torch.no_grad():
                for w in weights[r]:
                    w.copy_(new[offset : offset + w.numel()].view_as(w))
                    offset += w.numel()
    for got, expect in zip(results[0]["adam"], weights[0], strict=True):
        torch.testing.assert_close(got, expect.detach(), atol=1e-5, rtol=0)
    assert all(torch.equal(a, b) for r in results for a, b in zip(r["adam"], results[0]["adam"], strict=True))
    # not the mean of the four Adam steps: the combination differs where the deltas overlap
    assert not torch.allclose(torch.cat([w.reshape(-1) for w in results[0]["adam"]]), old + sum(deltas) / 4, atol=1e-3)

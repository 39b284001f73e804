"""The arithmetic of the sync modes: Adasum's combination and top-k with error feedback."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.runtime.sync.adasum import adasum_pair, adasum_tree, weighted_adasum_tree
from hetplan.runtime.sync.topk import TopK, densify


def _orthogonal(n: int, size: int = 8) -> list[torch.Tensor]:
    q, _ = torch.linalg.qr(torch.randn(size, size, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    return [q[:, i] * (i + 1) for i in range(n)]


def test_adasum_of_orthogonal_gradients_is_their_sum() -> None:
    for n in (2, 3, 4, 5):
        grads = _orthogonal(n)
        assert torch.allclose(adasum_tree(grads), sum(grads), atol=1e-12)


def test_adasum_of_identical_gradients_is_the_gradient() -> None:
    g = torch.randn(3, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    for n in (2, 3, 4, 7):
        assert torch.allclose(adasum_tree([g] * n), g, atol=1e-12)


def test_adasum_pair_by_its_formula_and_symmetry() -> None:
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(6, generator=gen, dtype=torch.float64), torch.randn(6, generator=gen, dtype=torch.float64)
    dot = a @ b
    expect = (1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b
    assert torch.allclose(adasum_pair(a, b), expect, atol=1e-12)
    assert torch.allclose(adasum_pair(a, b), adasum_pair(b, a), atol=1e-12)
    assert torch.equal(adasum_pair(a, torch.zeros(6, dtype=torch.float64)), a)


def test_adasum_tree_order_is_pairwise_then_carry() -> None:
    gen = torch.Generator().manual_seed(9)
    g = [torch.randn(4, generator=gen, dtype=torch.float64) for _ in range(3)]
    assert torch.allclose(adasum_tree(g), adasum_pair(adasum_pair(g[0], g[1]), g[2]), atol=1e-12)


@settings(max_examples=30, derandomize=True, deadline=None)
@given(st.lists(st.integers(1, 64), min_size=1, max_size=7))
def test_weighted_adasum_keeps_adasums_limits_for_any_shares(batches: list[int]) -> None:
    n = len(batches)
    g = torch.randn(9, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    assert torch.allclose(weighted_adasum_tree([g] * n, batches), g, atol=1e-10)  # agreement: the gradient
    ortho = _orthogonal(n, size=9)
    mean = sum(batches) / n
    expect = sum((b / mean) * x for b, x in zip(batches, ortho, strict=True))
    assert torch.allclose(weighted_adasum_tree(ortho, batches), expect, atol=1e-10)  # the weighted sum


def test_weighted_adasum_with_equal_shares_is_adasum() -> None:
    gen = torch.Generator().manual_seed(8)
    grads = [torch.randn(7, generator=gen, dtype=torch.float64) for _ in range(5)]
    assert torch.allclose(weighted_adasum_tree(grads, [3] * 5), adasum_tree(grads), atol=1e-12)


def test_topk_ratio_one_is_the_plain_sum() -> None:
    gen = torch.Generator().manual_seed(4)
    grads = [torch.randn(10, generator=gen) for _ in range(3)]
    parts = [TopK(1.0).compress("w", g) for g in grads]
    assert torch.equal(densify(parts, 10), grads[0] + grads[1] + grads[2])


def test_topk_sends_the_largest_and_keeps_the_rest() -> None:
    topk = TopK(0.3)
    g = torch.tensor([0.1, -5.0, 2.0, 0.0, 3.0, -0.2, 1.0, 0.5, -4.0, 0.05])
    idx, val = topk.compress("w", g)
    assert idx.tolist() == [1, 4, 8] and val.tolist() == [-5.0, 3.0, -4.0]
    assert torch.equal(topk.residual["w"] + densify([(idx, val)], 10), g)


def test_topk_ties_break_by_index() -> None:
    idx, _ = TopK(0.5).compress("w", torch.tensor([1.0, -1.0, 1.0, 1.0]))
    assert idx.tolist() == [0, 1]


@settings(max_examples=40, derandomize=True, deadline=None)
@given(st.floats(0.05, 1.0), st.integers(1, 6), st.integers(1, 40))
def test_error_feedback_delays_and_never_drops(ratio: float, steps: int, size: int) -> None:
    """Over any number of steps, what was sent plus what is kept equals everything given."""
    gen = torch.Generator().manual_seed(size * 7 + steps)
    topk, given_sum, sent_sum = (
        TopK(ratio),
        torch.zeros(size, dtype=torch.float64),
        torch.zeros(size, dtype=torch.float64),
    )
    for _ in range(steps):
        g = torch.randn(size, generator=gen, dtype=torch.float64)
        given_sum += g
        idx, val = topk.compress("w", g)
        assert len(idx) == topk.k_of(size)
        sent_sum += densify([(idx, val)], size)
    kept = topk.residual.get("w", torch.zeros(size, dtype=torch.float64))
    assert torch.allclose(sent_sum + kept, given_sum, atol=1e-9)

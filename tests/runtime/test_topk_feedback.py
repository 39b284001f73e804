"""Top-k's error feedback: ratio 1 runs selection and feedback (and is the sum), a non-finite gradient
never enters the residual, a skipped step gives the residual back, and the residual is checkpointed:
a run resumed from a checkpoint equals the uninterrupted run bit for bit."""

from __future__ import annotations

import torch

from hetplan.runtime.checkpoint import load_residuals, residual_state, save_checkpoint
from hetplan.runtime.sync.topk import TopK, densify

SIZE = 12
RANKS = 3


def _grad(rank: int, step: int) -> torch.Tensor:
    return torch.randn(SIZE, generator=torch.Generator().manual_seed(31 * step + rank))


def test_ratio_one_runs_selection_and_feedback_and_is_the_sum() -> None:
    compressors = [TopK(1.0) for _ in range(RANKS)]
    for step in range(3):
        parts = [c.compress("w", _grad(r, step)) for r, c in enumerate(compressors)]
        assert all(len(idx) == SIZE for idx, _ in parts)
        # the feedback path ran: every compressor holds a residual, and it is zero (all was sent)
        assert all(torch.equal(c.residual["w"], torch.zeros(SIZE)) for c in compressors)
        assert torch.allclose(densify(parts, SIZE), sum(_grad(r, step) for r in range(RANKS)), atol=1e-6, rtol=0)


def test_a_nan_never_enters_the_residual() -> None:
    topk = TopK(0.25)
    topk.compress("w", _grad(0, 0))
    before = topk.residual["w"].clone()
    bad = _grad(0, 1)
    bad[5], bad[9] = float("nan"), float("inf")
    idx, val = topk.compress("w", bad)
    assert {5, 9} <= set(idx.tolist())  # sent, so every rank's combined gradient shows the overflow
    assert not torch.isfinite(densify([(idx, val)], SIZE)).all()
    assert torch.equal(topk.residual["w"], before)  # the residual is what it was
    topk.compress("w", _grad(0, 2))
    assert torch.isfinite(topk.residual["w"]).all()


def test_a_skipped_step_gives_the_residual_back() -> None:
    topk = TopK(0.25)
    topk.compress("w", _grad(0, 0))
    topk.commit()
    before = topk.residual["w"].clone()
    topk.compress("w", _grad(0, 1))
    assert not torch.equal(topk.residual["w"], before)
    topk.rollback()  # another rank overflowed: the step is skipped everywhere
    assert torch.equal(topk.residual["w"], before)


def _train(compressors: list[TopK], weights: torch.Tensor, steps: range) -> torch.Tensor:
    """A toy SGD on the top-k combined gradient (each rank's gradient depends on the weights)."""
    for step in steps:
        parts = [c.compress("group0", _grad(r, step) + 0.1 * weights) for r, c in enumerate(compressors)]
        weights = weights - 0.1 * densify(parts, SIZE)
    return weights


def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path) -> None:
    start = torch.zeros(SIZE)
    whole = _train([TopK(0.2) for _ in range(RANKS)], start, range(6))
    first = [TopK(0.2) for _ in range(RANKS)]
    weights = _train(first, start, range(3))
    state = {"w": weights}
    for r, c in enumerate(first):
        state.update(residual_state(f"n0/{r}", c.state_dict()))
    save_checkpoint(tmp_path, state, step=3, info={"model": {}, "dtype": "fp32", "blocks": {}})
    resumed = [TopK(0.2) for _ in range(RANKS)]
    for r, c in enumerate(resumed):
        c.load_state_dict(load_residuals(tmp_path, f"n0/{r}"))
        assert torch.equal(c.residual["group0"], first[r].residual["group0"])
    assert torch.equal(_train(resumed, weights, range(3, 6)), whole)
    # without its residual the resumed run differs: the test would see a lost residual
    fresh = _train([TopK(0.2) for _ in range(RANKS)], weights, range(3, 6))
    assert not torch.equal(fresh, whole)
    assert load_residuals(tmp_path, "n9/9") == {}

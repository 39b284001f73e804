"""The simulator's busy and communicating time per device (``_union_lengths``): the plain loop
(small inputs) and the vectorised form (large ones) give the same floats, and both the union's
length by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest

from hetplan.simulate import simulator


def _both(rows, lo, hi, n_rows, monkeypatch):
    args = (np.asarray(rows, dtype=np.int64), np.asarray(lo, dtype=float), np.asarray(hi, dtype=float), n_rows)
    with monkeypatch.context() as m:
        m.setattr(simulator, "_LOOP_UNION", 10**9)
        loop = simulator._union_lengths(*args)
        m.setattr(simulator, "_LOOP_UNION", -1)
        vectorised = simulator._union_lengths(*args)
    return loop, vectorised


def test_by_hand(monkeypatch) -> None:
    # row 0: [0, 2) and [1, 3) merge to 3; [5, 6) adds 1. row 2: [1, 1.5) inside [0, 4): 4. row 1: none
    rows, lo, hi = [0, 2, 0, 2, 0], [0.0, 1.0, 1.0, 0.0, 5.0], [2.0, 1.5, 3.0, 4.0, 6.0]
    loop, vectorised = _both(rows, lo, hi, 3, monkeypatch)
    assert loop == vectorised == [4.0, 0.0, 4.0]
    assert _both([], [], [], 2, monkeypatch) == ([0.0, 0.0], [0.0, 0.0])


@pytest.mark.parametrize("seed", range(5))
def test_the_loop_and_the_vectorised_form_agree_to_the_bit(seed, monkeypatch) -> None:
    rng = random.Random(seed)
    n_rows = rng.randint(1, 8)
    rows, lo, hi = [], [], []
    for _ in range(rng.randint(1, 400)):
        a = rng.choice([rng.random() * 10, float(rng.randint(0, 10))])  # exact ties and touching ends too
        rows.append(rng.randrange(n_rows))
        lo.append(a)
        hi.append(a + rng.choice([0.0, rng.random(), 0.1 * rng.randint(1, 30)]))
    loop, vectorised = _both(rows, lo, hi, n_rows, monkeypatch)
    assert loop == vectorised

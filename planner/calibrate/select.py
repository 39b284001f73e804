"""Keep only the fitted factors that predict runs the fit has not seen better than the input figures.

:func:`~hetplan.calibrate.fit.identify` frees every parameter the data resolve. Resolved is not the
same as useful: a handful of runs that share a regime (all overhead-bound, all on one link) resolve a
compute factor or a collective efficiency that is right for them and wrong for every other plan, and
the calibrated files then predict the rest worse than the uncalibrated ones did. What the data can
say about that is the leave-one-out error: each run predicted by a fit that did not see it.

The rule (:func:`prune`), a backward elimination on that error:

1. score a free set by the mean absolute leave-one-out error of its fit over every run;
2. remove, one at a time, the parameter whose removal lowers the score most, while a removal lowers
   it by more than :data:`MIN_GAIN` (a parameter that leave-one-out cannot judge, because only one
   run shows it, changes nothing and is kept: the full fit uses what that run says);
3. then, while the kept set's score is not below the uncalibrated error (the input figures' own
   error on the same runs, which needs no fit), or any one run's leave-one-out error is above its
   uncalibrated error, remove the parameter whose removal lowers the score most: with none left,
   calibration writes the input figures back, and says so.

So a calibration can only keep factors that, by the one out-of-sample test the data allow, predict
better than no calibration at all. One run has no leave-one-out error: nothing is pruned, and the
output already says to measure a second plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MIN_GAIN", "Pruned", "prune"]

#: A removal must lower the mean absolute leave-one-out error by more than this (absolute, 0.1
#: percentage point): below it the two fits are the same within the solver's tolerance.
MIN_GAIN = 1e-3

#: Free sets larger than this are not pruned one by one (each step refits every run once per
#: parameter); only the final comparison with the uncalibrated error is made.
MAX_GREEDY = 12


@dataclass
class Pruned:
    """What :func:`prune` kept and dropped, with the scores that decided it."""

    kept: list[int]
    dropped: dict[int, str] = field(default_factory=dict)  # parameter -> why it went back to its input
    score: float | None = None  # mean |leave-one-out error| of the kept set (None: one run)
    raw_score: float | None = None  # mean |error| of the input figures on the same runs


def prune(
    free: Sequence[int],
    loo_errors: Callable[[list[int]], np.ndarray],
    raw_errors: np.ndarray,
    name: Callable[[int], str],
    n_runs: int,
) -> Pruned:
    """The parameters of ``free`` worth keeping (see the module docstring).

    ``loo_errors(subset)`` gives every run's relative leave-one-out error with ``subset`` free;
    ``raw_errors`` every run's relative error at the input figures."""
    kept = list(free)
    if n_runs < 2 or not kept:
        return Pruned(kept)
    raw_abs = np.abs(raw_errors)
    raw = float(np.mean(raw_abs))

    def score_of(subset: list[int]) -> float:
        return float(np.mean(np.abs(loo_errors(subset))))

    def without(subset: list[int]) -> tuple[float, int]:
        """The lowest score reachable by removing one parameter, and that parameter."""
        return min((score_of([k for k in subset if k != j]), j) for j in subset)

    score = score_of(kept)
    dropped: dict[int, str] = {}
    while len(kept) > 1 and len(free) <= MAX_GREEDY:
        best, j = without(kept)
        if best >= score - MIN_GAIN:
            break
        dropped[j] = f"dropped: leave-one-out error {100 * score:.1f}% with it, {100 * best:.1f}% without"
        kept = [k for k in kept if k != j]
        score = best
    # never worse than the input figures: not on average, and not on any run
    while kept:
        errors = np.abs(loo_errors(kept))
        worse = [i for i in range(len(errors)) if errors[i] > raw_abs[i] + MIN_GAIN]
        if score < raw - MIN_GAIN and not worse:
            break
        best, j = without(kept) if len(kept) > 1 else (raw, kept[0])
        if worse:
            i = worse[0]
            dropped[j] = (
                f"dropped: with it, run {i + 1}'s leave-one-out error {100 * errors[i]:.1f}% is above its "
                f"uncalibrated error {100 * raw_abs[i]:.1f}%"
            )
        else:
            dropped[j] = (
                f"dropped: the fit's leave-one-out error {100 * score:.1f}% is not below the uncalibrated "
                f"error {100 * raw:.1f}%"
            )
        kept = [k for k in kept if k != j]
        score = best
    return Pruned(kept, dropped, score, raw)

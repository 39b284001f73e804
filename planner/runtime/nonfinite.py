"""Whether a step's loss or gradient is not finite: the check every rank makes alike.

    what = nonfinite_what(loss, grad_norm, scaled=False)   # None, or "nan" / "inf" / "-inf" / "gradient"

Both figures come out of the step's one job-wide all-reduce (:meth:`RankExecutor._step`), so every
rank gets the same answer and skips the update with the others: no rank steps while another does
not, which would leave the replicas of a block apart for good. Under fp16 loss scaling a gradient
that overflows is the scaler's ordinary business (it halves the scale and skips the step itself);
only the loss counts there.
"""

from __future__ import annotations

import math

__all__ = ["nonfinite_what"]


def nonfinite_what(loss: float, grad_norm: float, *, scaled: bool) -> str | None:
    """What was not finite this step: the loss (its value, ``"nan"``, ``"inf"`` or ``"-inf"``), else
    the gradient norm (``"gradient"``, unless ``scaled``); None when both are finite."""
    if not math.isfinite(loss):
        return str(loss)
    if not scaled and not math.isfinite(grad_norm):
        return "gradient"
    return None

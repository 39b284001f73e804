"""A plain MLP: its settings.

Torch-free, so the torch zoo (:mod:`hetplan.models`) and the analytic profiler
(:mod:`hetplan.profile.analytic`) share one definition without depending on each other.
"""

from __future__ import annotations

__all__ = ["DEFAULTS", "HELP", "check"]

DEFAULTS: dict[str, int] = {"layers": 4, "width": 1024, "input": 784, "classes": 10}
HELP = "MLP: layers linear layers (input -> width ... -> classes), ReLU between; one block per linear"


def check(config: dict[str, int]) -> None:
    """Positive integers are all it needs (checked in common)."""

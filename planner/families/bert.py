"""A BERT encoder: its settings and their rules.

Torch-free, so the torch zoo (:mod:`hetplan.models`) and the analytic profiler
(:mod:`hetplan.profile.analytic`) share one definition without depending on each other.
"""

from __future__ import annotations

from hetplan.families.base import config_error

__all__ = ["DEFAULTS", "HELP", "check"]

DEFAULTS: dict[str, int] = {"layers": 12, "hidden": 768, "heads": 12, "seq": 128, "vocab": 30522, "positions": 512}
HELP = "BERT encoder (post-LN, FFN 4x hidden) with pooler, NSP and untied MLM heads; blocks as gpt"


def check(config: dict[str, int]) -> None:
    """Heads must split hidden; the position table must cover the sequence."""
    if config["hidden"] % config["heads"]:
        raise config_error("heads", f"expected a divisor of hidden ({config['hidden']}), got {config['heads']}")
    if config["seq"] > config["positions"]:
        raise config_error("seq", f"expected at most positions ({config['positions']}), got {config['seq']}")

"""A BERT encoder: its settings and their rules.

Torch-free, so the torch zoo (:mod:`hetplan.models`) and the analytic profiler
(:mod:`hetplan.profile.analytic`) share one definition without depending on each other.
"""

from __future__ import annotations

from hetplan.families.attention import check_attention
from hetplan.families.base import config_error

__all__ = ["DEFAULTS", "HELP", "check"]

#: ``attention``, ``dropout``: :mod:`hetplan.families.attention`; BERT pre-trains with dropout
DEFAULTS: dict[str, int | str] = {
    "layers": 12,
    "hidden": 768,
    "heads": 12,
    "seq": 128,
    "vocab": 30522,
    "positions": 512,
    "attention": "unfused",
    "dropout": "on",
}
HELP = "BERT encoder (post-LN, FFN 4x hidden) with pooler, NSP and untied MLM heads; blocks as gpt"


def check(config: dict) -> None:
    """Heads must split hidden; the position table must cover the sequence; a known kernel."""
    check_attention(config)
    if config["hidden"] % config["heads"]:
        raise config_error("heads", f"expected a divisor of hidden ({config['hidden']}), got {config['heads']}")
    if config["seq"] > config["positions"]:
        raise config_error("seq", f"expected at most positions ({config['positions']}), got {config['seq']}")

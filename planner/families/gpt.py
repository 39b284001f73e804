"""A GPT-2 style decoder: its settings and their rules.

Torch-free, so the torch zoo (:mod:`hetplan.models`) and the analytic profiler
(:mod:`hetplan.profile.analytic`) share one definition without depending on each other.
"""

from __future__ import annotations

from hetplan.families.attention import check_attention
from hetplan.families.base import config_error

__all__ = ["DEFAULTS", "HEADS", "HELP", "check"]

#: ``attention``, ``dropout``: :mod:`hetplan.families.attention`; the zoo writes attention out by
#: default (``fused``: ``scaled_dot_product_attention``) and has no dropout. ``head``: ``untied`` (its
#: own V·h matrix) or ``tied`` (GPT-2's: the LM head is the token table, one parameter held by the
#: embedding's and the head's ranks, :mod:`hetplan.runtime.parallel.tied`)
DEFAULTS: dict[str, int | str] = {
    "layers": 12,
    "hidden": 768,
    "heads": 12,
    "seq": 256,
    "vocab": 50257,
    "attention": "unfused",
    "dropout": "off",
    "head": "untied",
}
HELP = "GPT-2 style decoder (pre-LN, FFN 4x hidden, LM head untied or tied); blocks: embedding, layerN.attn/mlp, head"
HEADS = ("untied", "tied")


def check(config: dict) -> None:
    """Attention heads must split the hidden size evenly; the kernel and the head must be known ones."""
    check_attention(config)
    if config["head"] not in HEADS:
        raise config_error("head", f"expected one of {', '.join(HEADS)}, got {config['head']!r}")
    if config["hidden"] % config["heads"]:
        raise config_error("heads", f"expected a divisor of hidden ({config['hidden']}), got {config['heads']}")

"""A GPT-2 style decoder: its settings and their rules.

Torch-free, so the torch zoo (:mod:`hetplan.models`) and the analytic profiler
(:mod:`hetplan.profile.analytic`) share one definition without depending on each other.
"""

from __future__ import annotations

from hetplan.families.attention import check_attention
from hetplan.families.base import config_error

__all__ = ["DEFAULTS", "HELP", "check"]

#: ``attention``, ``dropout``: :mod:`hetplan.families.attention`; the zoo writes attention out by
#: default (``fused``: ``scaled_dot_product_attention``) and has no dropout
DEFAULTS: dict[str, int | str] = {
    "layers": 12,
    "hidden": 768,
    "heads": 12,
    "seq": 256,
    "vocab": 50257,
    "attention": "unfused",
    "dropout": "off",
}
HELP = "GPT-2 style decoder (pre-LN, FFN 4x hidden, untied LM head); blocks: embedding, layerN.attn/mlp, head"


def check(config: dict) -> None:
    """Attention heads must split the hidden size evenly; the kernel must be a known one."""
    check_attention(config)
    if config["hidden"] % config["heads"]:
        raise config_error("heads", f"expected a divisor of hidden ({config['hidden']}), got {config['heads']}")

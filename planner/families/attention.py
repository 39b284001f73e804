"""How a transformer family runs attention and dropout: model settings, since they decide memory.

    config["attention"] in ATTENTION_KERNELS        # "unfused" or "fused"
    config["dropout"] in DROPOUT                    # "off" or "on"

What the attention core keeps for backward per layer and sample (a heads, s tokens, d bytes per
element, tensor-parallel degree t), beyond Q, K, V and its output:

- ``unfused`` (scores materialised: eager PyTorch, Hugging Face ``eager``, Megatron's unfused
  softmax): the softmax output, a·s²·d/t (the product with V keeps it as its input; the scale and
  the causal mask save nothing of their own); with ``dropout: on`` also its dropout output and the
  1-byte mask, a·s²·(2d + 1)/t in all (Korthikanti et al. 2022, Table 2).
- ``fused`` (``scaled_dot_product_attention``: FlashAttention, Dao et al. 2022, or the
  memory-efficient kernel): no s² tensor, the per-row logsumexp at fp32, a·s·4/t; a dropout mask is
  regenerated from the RNG state, not kept.

``dropout: on`` also keeps a 1-byte mask of s·h per residual dropout (after attention, after the
MLP) and after the embedding; ``off`` (the zoo GPT, and modern LLM pre-training) keeps none.
"""

from __future__ import annotations

from hetplan.families.base import config_error

__all__ = ["ATTENTION_KERNELS", "DROPOUT", "check_attention"]

ATTENTION_KERNELS = ("unfused", "fused")
DROPOUT = ("off", "on")


def check_attention(config: dict) -> None:
    """``config["attention"]`` and ``config["dropout"]`` must name known choices."""
    for key, known in (("attention", ATTENTION_KERNELS), ("dropout", DROPOUT)):
        if config[key] not in known:
            raise config_error(key, f"expected one of {', '.join(known)}, got {config[key]!r}")

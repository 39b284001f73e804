"""BERT (encoder-only, post-LN) at sub-block granularity, with the pre-training heads.

    from hetplan.profile.analytic import FAMILIES
    costs = FAMILIES["bert"].blocks()        # BERT-base, seq 128
    costs[-1].name                           # 'head'

Blocks: ``embedding`` (word + position + token-type lookups, LayerNorm, dropout), then per layer
``layerN.attn`` and ``layerN.mlp`` (bidirectional attention: the same FLOPs as GPT's causal one,
which computes the full s x s score matrix and masks it), then ``head``: the pooler (dense + tanh
on the [CLS] token), the next-sentence classifier, and the MLM head (dense + GeLU + LayerNorm +
decoder with bias over every position, as Hugging Face computes it). The MLM decoder is
**untied** from the word embedding (V·h extra parameters), for the reason given in
:mod:`hetplan.profile.analytic.gpt`. ``positions`` is the size of the position table (512 in
BERT-base), which must hold ``seq``.
"""

from __future__ import annotations

from hetplan.families.bert import DEFAULTS, HELP, check
from hetplan.profile.analytic.base import BlockCost, dtype_bytes, gemm_work, memory_work
from hetplan.profile.analytic.transformer import attention_block, layer_blocks_at, mlp_block

__all__ = ["DEFAULTS", "HELP", "blocks", "blocks_at", "check", "input_bytes"]

#: Token ids are int64; token types come with them (counted as the ids' second half).
TOKEN_ID_BYTES = 8
TOKEN_TYPES = 2


def _embedding(s: int, h: int, v: int, positions: int, d: int) -> BlockCost:
    params = v * h + positions * h + TOKEN_TYPES * h + 2 * h
    # ids read; three rows gathered, sum written, LN read+write, dropout read+write; mask
    traffic = 2 * s * TOKEN_ID_BYTES + 8 * s * h * d + s * h
    return BlockCost(
        name="embedding",
        kind="embedding",
        params=params,
        param_bytes=float(params * d),
        flops_fwd=0.0,
        activation_bytes=float(s * h * d + s * h),  # LayerNorm input, dropout mask
        output_bytes=float(s * h * d),
        weight_traffic=0.0,
        activation_traffic=float(traffic),
        work_items=float(s),
        kernels=7,  # three lookups, two adds, LayerNorm, dropout
        bwd_weight_traffic=float(2 * params * d),
        parts=(memory_work(traffic, 7, bwd_weight_traffic=float(2 * params * d)),),
    )


def _head(s: int, h: int, v: int, d: int) -> BlockCost:
    pooler = h * h + h
    nsp = 2 * h + 2
    mlm = (h * h + h) + 2 * h + (v * h + v)
    params = pooler + nsp + mlm
    flops = 2.0 * h * h + 2.0 * h * 2 + 2.0 * s * h * h + 2.0 * s * h * v
    # MLM: dense input, GeLU input, LN input, decoder input (s·h each), log-softmax (s·V);
    # pooler: [CLS] input, tanh output; NSP: input, log-softmax (2).
    activation = 4 * s * h * d + s * v * d + 3 * h * d + 2 * d
    # ... and the loss's log-softmax over the MLM logits (read + write s·V)
    traffic = d * (2 * s * h + 2 * s * h + 2 * s * h + s * h + s * v + 4 * h + 2 + 2 * s * v)
    parts = (
        gemm_work(1, h, h, d),  # pooler dense on [CLS]
        gemm_work(1, h, 2, d),  # next-sentence classifier
        gemm_work(s, h, h, d),  # MLM dense
        gemm_work(s, h, v, d),  # MLM decoder: writes the s·V logits
        # tanh, GeLU (read+write s·h), LayerNorm (read+write s·h), decoder bias; their weights
        memory_work(d * (4 * s * h + h), 4, weight_traffic=d * (h + 2 + h + 2 * h + v)),
        memory_work(d * 2 * s * v, 1),  # the loss's log-softmax over the MLM logits
    )
    return BlockCost(
        name="head",
        kind="head",
        params=params,
        param_bytes=float(params * d),
        flops_fwd=flops,
        activation_bytes=float(activation),
        output_bytes=float(s * v * d + 2 * d),  # MLM and NSP logits
        weight_traffic=float(params * d),
        activation_traffic=float(traffic),
        work_items=float(s),
        kernels=9,  # pooler dense, tanh, NSP dense, MLM dense, GeLU, LN, decoder, bias, log-softmax
        parts=parts,
    )


def blocks(config: dict[str, int], dtype: str) -> list[BlockCost]:
    """The block list for a full, checked config."""
    d = dtype_bytes(dtype)
    s, h, a, v = config["seq"], config["hidden"], config["heads"], config["vocab"]
    dropout = config["dropout"] == "on"
    out = [_embedding(s, h, v, config["positions"], d)]
    for i in range(config["layers"]):
        out.append(
            attention_block(
                f"layer{i}.attn", seq=s, hidden=h, heads=a, dtype_bytes=d, kernel=config["attention"], dropout=dropout
            )
        )
        out.append(mlp_block(f"layer{i}.mlp", seq=s, hidden=h, ffn=4 * h, dtype_bytes=d, dropout=dropout))
    out.append(_head(s, h, v, d))
    return out


def input_bytes(config: dict[str, int], dtype: str) -> float:
    """Per sample: ``seq`` int64 token ids and as many int64 token types."""
    return float(2 * config["seq"] * TOKEN_ID_BYTES)


def blocks_at(config: dict[str, int], dtype: str, tp: int) -> list[BlockCost | None]:
    """One device's costs of each block at degree ``tp`` (the shared transformer rule; the
    embedding and head replicated in the group)."""
    return layer_blocks_at(config, dtype, tp, whole=blocks(config, dtype))

"""GPT (decoder-only, pre-LN, GPT-2 layout) at sub-block granularity.

    from hetplan.profile.analytic import FAMILIES
    costs = FAMILIES["gpt"].blocks({"layers": 12, "hidden": 768, "seq": 1024})
    [c.name for c in costs][:3]          # ['embedding', 'layer0.attn', 'layer0.mlp']

Blocks: ``embedding`` (token + position lookup, add, dropout), then per layer ``layerN.attn`` and
``layerN.mlp`` (see :mod:`hetplan.profile.analytic.transformer`), then ``head`` (final LayerNorm and
the LM head). The LM head is **untied**: it has its own V·h weight matrix, so the parameter count
is GPT-2's (which ties it to the token embedding) plus V·h. Tying would make two stages share a
weight, which a pipeline partition cannot express without an extra all-reduce. The position
table has ``seq`` rows (the model is built for the context it trains at).

The head returns the logits (s·V·d bytes per sample); the cross-entropy's saved log-softmax
(s·V·4: the loss runs in fp32 whatever the dtype, under autocast for fp16/bf16) is counted in the
head's activation bytes, since the loss runs on the same device.

At tensor-parallel degree t the embedding and head are **vocabulary-parallel** (Megatron-LM,
Shoeybi et al. 2019 section 3; the runtime's :mod:`hetplan.models.gpt_tp`): each member keeps
``n = ceil(V/t)`` rows of the token table and of the LM head (the table padded to n·t rows), so
its parameters are n·h + seq·h (embedding) and 2h + n·h (head), its logits s·n·d and the loss's
saved softmax s·n·4, and the head's GEMM and log-softmax do 1/t of the work. The embedding
all-reduces its output in forward (s·h·d), the head its input gradient in backward (s·h·d) and the
loss three row statistics (max, target logit, sum of exponentials: 3·s·4 bytes); each runs in one
pass, so ``allreduce_bytes`` (priced in both passes by the cost model) is half of it.

``head: tied`` (GPT-2's): the token table is the LM head's weight, one parameter the embedding and
the head hold, listed once under the profile's ``shared`` (:func:`shared`: V·h, n·h per member at
degree t) and in neither block's ``params``. Each stage holding either end keeps a copy
(:mod:`hetplan.runtime.parallel.tied`), a stage holding both keeps one; the block costs (times,
weight traffic) still read the table, as the kernels do.
"""

from __future__ import annotations

from typing import Any

from hetplan.contracts.model_profile import SharedParams
from hetplan.families.gpt import DEFAULTS, HELP, check
from hetplan.profile.analytic.base import BlockCost, dtype_bytes, gemm_work, memory_work
from hetplan.profile.analytic.transformer import attention_block, layer_blocks_at, mlp_block

#: The loss runs in fp32 (autocast keeps cross-entropy in fp32 for fp16 and bf16 training).
FP32 = 4

__all__ = [
    "DEFAULTS",
    "HELP",
    "blocks",
    "blocks_at",
    "check",
    "embedding_block",
    "input_bytes",
    "lm_head_block",
    "shared",
    "vocab_rows",
]

#: Token ids are int64.
TOKEN_ID_BYTES = 8


def vocab_rows(vocab: int, tp: int) -> int:
    """Rows of the token table and LM head one member of a degree-``tp`` group keeps (padded)."""
    return -(-vocab // tp)


def embedding_block(
    *, seq: int, hidden: int, vocab: int, positions: int, d: int, dropout: bool = True, tp: int = 1
) -> BlockCost:
    """Token and position lookups, their sum and dropout (GPT-2 layout, no LayerNorm); without
    dropout it keeps nothing for backward (a lookup needs only the ids). At ``tp`` > 1 one member's
    vocabulary-parallel share: its rows of the token table, the output all-reduced."""
    s, h = seq, hidden
    params = vocab_rows(vocab, tp) * h + positions * h
    traffic = s * TOKEN_ID_BYTES + 5 * s * h * d + s * h
    return BlockCost(
        name="embedding",
        kind="embedding",
        params=params,
        param_bytes=float(params * d),
        flops_fwd=0.0,
        activation_bytes=float(s * h if dropout else 0.0),  # the dropout mask; lookups need only the ids
        output_bytes=float(s * h * d),
        weight_traffic=0.0,  # a lookup reads s rows per sample, counted below, not the table
        # ids read, two rows gathered, sum written, dropout read+write, mask written
        activation_traffic=float(traffic),
        work_items=float(s),
        kernels=4,  # two lookups, add, dropout
        # backward fills a dense gradient for both tables and accumulates into .grad
        bwd_weight_traffic=float(2 * params * d),
        parts=(memory_work(traffic, 4, bwd_weight_traffic=float(2 * params * d)),),
        allreduce_bytes=s * h * d / 2.0 if tp > 1 else 0.0,  # the output, in forward only
    )


def lm_head_block(*, seq: int, hidden: int, vocab: int, d: int, tp: int = 1) -> BlockCost:
    """Final LayerNorm + untied LM head (no bias); returns logits. The loss's log-softmax runs on
    the same device, so its pass over the logits is counted here too. At ``tp`` > 1 one member's
    vocabulary-parallel share: its rows of the head, its slice of the logits and of the loss."""
    s, h, v = seq, hidden, vocab_rows(vocab, tp)
    params = 2 * h + v * h
    parts = (
        memory_work(d * 2 * s * h, 1, weight_traffic=d * 2 * h),  # LayerNorm read + write
        gemm_work(s, h, v, d),  # LM head: reads s·h, writes the s·V logits
        memory_work((d + FP32) * s * v, 1),  # the loss's log-softmax: reads the logits, writes fp32
    )
    return BlockCost(
        name="head",
        kind="head",
        params=params,
        param_bytes=float(params * d),
        flops_fwd=2.0 * s * h * v,
        # LN input, LM-head input, and the loss's log-softmax over the logits, which runs in fp32
        # whatever the dtype (torch.autocast keeps the loss in fp32, and the runtime trains fp16/bf16
        # under autocast): s·V·4 bytes, the largest activation of a long-vocabulary model
        activation_bytes=float(2 * s * h * d + s * v * FP32),
        output_bytes=float(s * v * d),
        weight_traffic=float(params * d),
        # LN read+write, GEMM read, logits written, log-softmax read + write
        activation_traffic=float(d * (2 * s * h + s * h + s * v + s * v) + FP32 * s * v),
        work_items=float(s),
        kernels=3,
        parts=parts,
        # the input gradient (backward) and the loss's row statistics (forward), one pass each
        allreduce_bytes=(s * h * d + 3 * s * FP32) / 2.0 if tp > 1 else 0.0,
    )


def shared(config: dict[str, Any], dtype: str, degrees: list[int]) -> list[SharedParams]:
    """With ``head: tied``, the token table the embedding (block 0) and the head (the last block)
    hold: V·h, each member of a degree-t group its vocabulary-parallel ⌈V/t⌉·h rows."""
    if config.get("head") != "tied":
        return []
    d = dtype_bytes(dtype)
    h, v = config["hidden"], config["vocab"]
    last = 2 * config["layers"] + 1
    return [
        SharedParams(
            name="embedding.tokens.weight",  # the runtime's canonical name (hetplan.models.gpt)
            params=v * h,
            param_bytes=float(v * h * d),
            blocks=(0, last),
            tensor_parallel={t: (vocab_rows(v, t) * h, float(vocab_rows(v, t) * h * d)) for t in degrees if t > 1},
        )
    ]


def blocks(config: dict[str, int], dtype: str) -> list[BlockCost]:
    """The block list for a full, checked config."""
    d = dtype_bytes(dtype)
    s, h, a, v = config["seq"], config["hidden"], config["heads"], config["vocab"]
    dropout = config["dropout"] == "on"
    out = [embedding_block(seq=s, hidden=h, vocab=v, positions=s, d=d, dropout=dropout)]
    for i in range(config["layers"]):
        out.append(
            attention_block(
                f"layer{i}.attn", seq=s, hidden=h, heads=a, dtype_bytes=d, kernel=config["attention"], dropout=dropout
            )
        )
        out.append(mlp_block(f"layer{i}.mlp", seq=s, hidden=h, ffn=4 * h, dtype_bytes=d, dropout=dropout))
    out.append(lm_head_block(seq=s, hidden=h, vocab=v, d=d))
    return out


def input_bytes(config: dict[str, int], dtype: str) -> float:
    """Per sample: ``seq`` int64 token ids."""
    return float(config["seq"] * TOKEN_ID_BYTES)


def blocks_at(config: dict[str, int], dtype: str, tp: int) -> list[BlockCost | None]:
    """One device's costs of each block at degree ``tp``: the layers by the shared transformer
    rule, the embedding and head vocabulary-parallel (as the runtime cuts them by default)."""
    out = layer_blocks_at(config, dtype, tp, whole=blocks(config, dtype))
    if out[0] is None:
        return out
    d = dtype_bytes(dtype)
    s, h, v = config["seq"], config["hidden"], config["vocab"]
    dropout = config["dropout"] == "on"
    out[0] = embedding_block(seq=s, hidden=h, vocab=v, positions=s, d=d, dropout=dropout, tp=tp)
    out[-1] = lm_head_block(seq=s, hidden=h, vocab=v, d=d, tp=tp)
    return out

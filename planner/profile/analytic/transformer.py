"""Transformer sub-blocks shared by the ``gpt`` and ``bert`` families: attention and MLP.

    attn = attention_block("layer0.attn", seq=256, hidden=768, heads=12, dtype_bytes=2)
    attn.flops_fwd == 8 * 256 * 768**2 + 4 * 256**2 * 768

Per sample, s = seq, h = hidden, a = heads, f = ffn (4h), d = bytes per element:

- FLOPs (2 per multiply-add): attention 8·s·h² (QKV 6·s·h², output 2·s·h²) + 4·s²·h (QKᵀ and AV,
  2·2·s²·h); MLP 4·s·h·f = 16·s·h². A layer is 24·s·h² + 4·s²·h (Narayanan et al. 2021).
- Params: attention LayerNorm 2h + QKV 3h² + 3h + output h² + h = 4h² + 6h; MLP LayerNorm 2h +
  h·f + f + f·h + h = 8h² + 7h (f = 4h).
- Activations kept for backward, Korthikanti et al. 2022 (no recompute, no sequence parallelism),
  generalised from 2-byte elements to d bytes, dropout masks 1 byte each:
  attention (with its LayerNorm) s·h·(6d + 1) + a·s²·(2d + 1); MLP (with its LayerNorm)
  s·(2h·d + 2f·d + h). At d = 2, f = 4h the two add up to the paper's s·h·(34 + 5·a·s/h).
- Output: the hidden state, s·h·d.

Pre-LN (GPT) and post-LN (BERT) layers cost the same: the LayerNorm only moves to the other end.

Tensor parallelism at degree t (Megatron-LM, Shoeybi et al. 2019; no sequence parallelism): QKV
and the up projection are column-parallel, the output and down projections row-parallel, so every
GEMM's split dimension is divided by t (QKV [s, h] x [h, 3h/t], output [s, h/t] x [h/t, h], up
[s, h] x [h, f/t], down [s, f/t] x [f/t, h]) and attention runs a/t heads; each smaller GEMM is
priced by the same achieved-efficiency model (fewer tiles, lower saturation: not an ideal 1/t).
What Megatron does not split stays whole: LayerNorm, the residual dropout and add on s·h, the
row-parallel bias, the LayerNorm parameters. Per device: params (4h² + 3h)/t + 3h (attention),
(2h·f + f)/t + 3h (MLP); activations (Korthikanti et al. 2022, Table 2, generalised to d bytes)
attention s·h·(2d + 1) + 4·s·h·d/t + a·s²·(2d + 1)/t, MLP s·h·(2d + 1) + 2·s·f·d/t, at d = 2 and
f = 4h together s·h·(10 + 24/t + 5·a·s/(h·t)). Each block ends in one all-reduce of its output,
s·h·d per sample, in forward (g) and one of its input gradient in backward (f).

Selective recomputation (Korthikanti et al. 2022) drops the attention internals a·s²·(2d + 1)/t
(softmax output, its dropout mask and output) and recomputes the attention core: QKᵀ, softmax,
dropout and AV, the ``recompute_parts`` (their forward time is the recompute cost).

Work by kind (each on its own roof, docs/estimates.md): attention = the QKV and output-projection
GEMMs + the batched per-head QKᵀ and AV matmuls (``attention``) + LayerNorm, head split, softmax,
dropouts and the residual add (``memory``); MLP = the two GEMMs + LayerNorm, GeLU, dropout and
the residual add. Attention is taken unfused (scores materialised), as the eager frameworks of
the published measurements run it; biases and LayerNorm weights are read by the memory kernels.
"""

from __future__ import annotations

from hetplan.profile.analytic.base import BlockCost, dtype_bytes, gemm_work, memory_work

__all__ = [
    "attention_block",
    "attention_core_bytes",
    "attention_params",
    "layer_blocks_at",
    "mlp_block",
    "mlp_params",
    "tp_divides",
]


def tp_divides(tp: int, *, heads: int, ffn: int) -> bool:
    """Whether degree ``tp`` splits a layer evenly: whole heads and whole MLP columns per device."""
    return tp >= 1 and heads % tp == 0 and ffn % tp == 0


def attention_params(hidden: int, tp: int = 1) -> int:
    """LayerNorm (2h) + QKV projection (3h² + 3h) + output projection (h² + h); at degree ``tp``
    one device's: QKV weight and bias and the output weight / tp, LayerNorm and output bias whole."""
    h = hidden
    return 2 * h + (3 * h * h + 3 * h) // tp + (h * h) // tp + h


def mlp_params(hidden: int, ffn: int, tp: int = 1) -> int:
    """LayerNorm (2h) + up projection (h·f + f) + down projection (f·h + h); at degree ``tp`` one
    device's: the up weight and bias and the down weight / tp, LayerNorm and down bias whole."""
    h, f = hidden, ffn
    return 2 * h + (h * f + f) // tp + (f * h) // tp + h


def attention_core_bytes(
    *, seq: int, heads: int, dtype_bytes: int, tp: int = 1, kernel: str = "unfused", dropout: bool = True
) -> float:
    """Per sample, what the attention core keeps for backward beyond Q, K, V and its output
    (:mod:`hetplan.families.attention`): ``unfused`` the softmax output a·s²·d/t, with dropout also
    its dropout output and 1-byte mask, a·s²·(2d + 1)/t (Korthikanti et al. 2022); ``fused``
    (FlashAttention, SDPA) the fp32 logsumexp per row, a·s·4/t, dropout or not."""
    s, a, d, t = seq, heads, dtype_bytes, tp
    if kernel == "fused":
        return a * s * 4.0 / t
    return a * s * s * ((2 * d + 1) if dropout else d) / t


def attention_block(
    name: str,
    *,
    seq: int,
    hidden: int,
    heads: int,
    dtype_bytes: int,
    tp: int = 1,
    kernel: str = "unfused",
    dropout: bool = True,
) -> BlockCost:
    """LayerNorm + QKV + scaled-dot-product attention + output projection + residual; at ``tp``
    >= 2 what one device of a Megatron tensor-parallel group does and keeps. ``kernel`` decides what
    the attention core keeps (:func:`attention_core_bytes`); the time model prices the unfused one."""
    s, h, a, d, t = seq, hidden, heads, dtype_bytes, tp
    params = attention_params(h, t)
    flops = (2.0 * s * h * 3 * h + 2.0 * 2 * s * s * h + 2.0 * s * h * h) / t
    # Korthikanti: LN input, QKV input, the residual dropout mask (whole: s·h·(2d + 1), the mask
    # only with dropout); Q and K, V, output-projection input (4 tensors of s·h/t); the core's own
    # tensors by kernel (unfused with dropout: softmax output and its dropout output, a·s²/t each,
    # and the mask, a·s²/t, 1 byte).
    selective = attention_core_bytes(seq=s, heads=a, dtype_bytes=d, tp=t, kernel=kernel, dropout=dropout)
    activation = s * h * (2 * d + (1 if dropout else 0)) + 4 * s * h * d / t + selective
    # Unfused forward: LN read+write 2, out-projection output 1, dropout+residual read 2 write 1
    # (whole s·h: 6); QKV read 1 (whole) write 3, QKᵀ read 2, AV read 1 write 1, out projection
    # read 1 (s·h/t: 9, less the whole QKV read); scores written, softmax read+write, dropout
    # read+write, read by AV (a·s²/t: 6); two 1-byte masks written.
    traffic = d * (7 * s * h + 8 * s * h / t + 6 * a * s * s / t) + s * h + a * s * s / t
    dh = h // a
    # softmax and dropout read+write (4·a·s²/t) and the dropout mask: the core's memory-bound kernels
    core_memory = memory_work(d * 4 * a * s * s / t + a * s * s / t, 2)
    core = (
        gemm_work(s, dh, s, d, batch=a / t, weights=False, kind="attention"),  # QKᵀ: reads Q, K; writes a·s²/t
        gemm_work(s, s, dh, d, batch=a / t, weights=False, kind="attention"),  # AV: reads scores, V; writes s·h/t
        core_memory,
    )
    parts = (
        gemm_work(s, h, 3 * h / t, d),  # QKV projection (column-parallel): reads s·h, writes 3·s·h/t
        core[0],
        core[1],
        gemm_work(s, h / t, h, d),  # output projection (row-parallel): reads s·h/t, writes s·h
        core_memory,
        # LN read+write, dropout+residual read 2 write 1 (5·s·h), the residual mask; LN, head split,
        # dropout, add; LN weights, the QKV bias (/t) and the output bias read
        memory_work(d * 5 * s * h + s * h, 4, weight_traffic=d * (2 * h + 3 * h / t + h)),
    )
    return BlockCost(
        name=name,
        kind="attention",
        params=params,
        param_bytes=float(params * d),
        flops_fwd=flops,
        activation_bytes=float(activation),
        output_bytes=float(s * h * d),
        weight_traffic=float(params * d),
        activation_traffic=float(traffic),
        work_items=float(s),
        kernels=10,  # LN, QKV, head split, QKᵀ, softmax, dropout, AV, out, dropout, add
        parts=parts,
        selective_bytes=float(selective),
        recompute_parts=core,
        allreduce_bytes=float(s * h * d) if t > 1 else 0.0,
    )


def mlp_block(
    name: str, *, seq: int, hidden: int, ffn: int, dtype_bytes: int, tp: int = 1, dropout: bool = True
) -> BlockCost:
    """LayerNorm + up projection + GeLU + down projection + dropout + residual; at ``tp`` >= 2 what
    one device of a Megatron tensor-parallel group does and keeps."""
    s, h, f, d, t = seq, hidden, ffn, dtype_bytes, tp
    params = mlp_params(h, f, t)
    flops = 2.0 * s * h * f * 2 / t
    # Korthikanti: LN input, up-projection input, dropout mask (whole: s·h·(2d + 1), the mask only
    # with dropout); GeLU input, down-projection input (s·f/t each).
    activation = s * h * (2 * d + (1 if dropout else 0)) + 2 * s * f * d / t
    # Unfused forward: LN 2·s·h, up s·h + s·f/t, GeLU 2·s·f/t, down s·f/t + s·h, dropout+residual 3·s·h.
    traffic = d * s * (7 * h + 4 * f / t) + s * h
    parts = (
        gemm_work(s, h, f / t, d),  # up projection (column-parallel)
        gemm_work(s, f / t, h, d),  # down projection (row-parallel)
        # LN read+write 2·s·h, GeLU read+write 2·s·f/t, dropout+residual 3·s·h, the mask; LN, GeLU,
        # dropout, add; LN weights, the up bias (/t), the down bias
        memory_work(d * s * (5 * h + 2 * f / t) + s * h, 4, weight_traffic=d * (2 * h + f / t + h)),
    )
    return BlockCost(
        name=name,
        kind="mlp",
        params=params,
        param_bytes=float(params * d),
        flops_fwd=flops,
        activation_bytes=float(activation),
        output_bytes=float(s * h * d),
        weight_traffic=float(params * d),
        activation_traffic=float(traffic),
        work_items=float(s),
        kernels=6,  # LN, up, GeLU, down, dropout, add
        parts=parts,
        allreduce_bytes=float(s * h * d) if t > 1 else 0.0,
    )


def layer_blocks_at(config: dict[str, int], dtype: str, tp: int, *, whole: list[BlockCost]) -> list[BlockCost | None]:
    """One device's costs of each block of an embedding + layers + head transformer (gpt, bert) at
    tensor-parallel degree ``tp`` (None: not split). The layers split Megatron-style; the embedding
    and the head (``whole``'s first and last, the degree-1 costs) are **replicated** in the group:
    every member holds and computes them whole, no all-reduce (BERT's, as the runtime runs them;
    the GPT family replaces them with its vocabulary-parallel ones, :func:`hetplan.profile.analytic.gpt.blocks_at`).
    So a stage of any degree may hold them. All None where ``tp`` does not divide heads and the MLP."""
    d = dtype_bytes(dtype)
    s, h, a = config["seq"], config["hidden"], config["heads"]
    n_blocks = 2 * config["layers"] + 2
    if tp < 2 or not tp_divides(tp, heads=a, ffn=4 * h):
        return [None] * n_blocks
    kernel, dropout = config.get("attention", "unfused"), config.get("dropout", "on") == "on"
    out: list[BlockCost | None] = [whole[0]]
    for i in range(config["layers"]):
        out.append(
            attention_block(
                f"layer{i}.attn", seq=s, hidden=h, heads=a, dtype_bytes=d, tp=tp, kernel=kernel, dropout=dropout
            )
        )
        out.append(mlp_block(f"layer{i}.mlp", seq=s, hidden=h, ffn=4 * h, dtype_bytes=d, tp=tp, dropout=dropout))
    out.append(whole[-1])
    return out

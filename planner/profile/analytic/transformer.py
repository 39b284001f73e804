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

Work by kind (each on its own roof, docs/estimates.md): attention = the QKV and output-projection
GEMMs + the batched per-head QKᵀ and AV matmuls (``attention``) + LayerNorm, head split, softmax,
dropouts and the residual add (``memory``); MLP = the two GEMMs + LayerNorm, GeLU, dropout and
the residual add. Attention is taken unfused (scores materialised), as the eager frameworks of
the published measurements run it; biases and LayerNorm weights are read by the memory kernels.
"""

from __future__ import annotations

from hetplan.profile.analytic.base import BlockCost, gemm_work, memory_work

__all__ = ["attention_block", "attention_params", "mlp_block", "mlp_params"]


def attention_params(hidden: int) -> int:
    """LayerNorm (2h) + QKV projection (3h² + 3h) + output projection (h² + h)."""
    h = hidden
    return 2 * h + (3 * h * h + 3 * h) + (h * h + h)


def mlp_params(hidden: int, ffn: int) -> int:
    """LayerNorm (2h) + up projection (h·f + f) + down projection (f·h + h)."""
    h, f = hidden, ffn
    return 2 * h + (h * f + f) + (f * h + h)


def attention_block(name: str, *, seq: int, hidden: int, heads: int, dtype_bytes: int) -> BlockCost:
    """LayerNorm + QKV + scaled-dot-product attention (with dropout) + output projection + residual."""
    s, h, a, d = seq, hidden, heads, dtype_bytes
    params = attention_params(h)
    flops = 2.0 * s * h * 3 * h + 2.0 * 2 * s * s * h + 2.0 * s * h * h
    # Korthikanti: LN input, QKV input, Q and K, V, output-projection input (6 tensors of s·h),
    # the residual dropout mask (s·h, 1 byte); softmax output and its dropout output (a·s² each),
    # the attention dropout mask (a·s², 1 byte).
    activation = s * h * (6 * d + 1) + a * s * s * (2 * d + 1)
    # Unfused forward: LN read+write 2, QKV read 1 write 3, QKᵀ read 2, AV read 1 write 1, out
    # projection read+write 2, dropout+residual read 2 write 1 (s·h elements: 15); scores written,
    # softmax read+write, dropout read+write, read by AV (a·s²: 6); two 1-byte masks written.
    traffic = d * (15 * s * h + 6 * a * s * s) + s * h + a * s * s
    dh = h // a
    parts = (
        gemm_work(s, h, 3 * h, d),  # QKV projection: reads s·h, writes 3·s·h
        gemm_work(s, dh, s, d, batch=a, weights=False, kind="attention"),  # QKᵀ: reads Q, K; writes a·s²
        gemm_work(s, s, dh, d, batch=a, weights=False, kind="attention"),  # AV: reads a·s², V; writes s·h
        gemm_work(s, h, h, d),  # output projection
        # LN read+write, dropout+residual read 2 write 1 (5·s·h); softmax and dropout read+write
        # (4·a·s²); two 1-byte masks; LN, head split, softmax, dropout, dropout, add
        memory_work(d * (5 * s * h + 4 * a * s * s) + s * h + a * s * s, 6, weight_traffic=d * (2 * h + 3 * h + h)),
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
    )


def mlp_block(name: str, *, seq: int, hidden: int, ffn: int, dtype_bytes: int) -> BlockCost:
    """LayerNorm + up projection + GeLU + down projection + dropout + residual."""
    s, h, f, d = seq, hidden, ffn, dtype_bytes
    params = mlp_params(h, f)
    flops = 2.0 * s * h * f * 2
    # Korthikanti: LN input, up-projection input (s·h each), GeLU input, down-projection input
    # (s·f each), dropout mask (s·h, 1 byte).
    activation = s * (2 * h * d + 2 * f * d + h)
    # Unfused forward: LN 2·s·h, up s·h + s·f, GeLU 2·s·f, down s·f + s·h, dropout+residual 3·s·h.
    traffic = d * s * (7 * h + 4 * f) + s * h
    parts = (
        gemm_work(s, h, f, d),  # up projection
        gemm_work(s, f, h, d),  # down projection
        # LN read+write 2·s·h, GeLU read+write 2·s·f, dropout+residual 3·s·h, the mask; LN, GeLU, dropout, add
        memory_work(d * s * (5 * h + 2 * f) + s * h, 4, weight_traffic=d * (2 * h + f + h)),
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
    )

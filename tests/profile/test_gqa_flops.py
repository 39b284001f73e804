"""FLOPs of grouped-query attention are counted where torch's own counter refuses them.

Before torch 2.13, ``torch.utils.flop_counter.sdpa_flop_count`` asserted equal query and key/value
heads, so ``hetplan profile`` of a Llama with ``num_key_value_heads < heads`` on a GPU (where
transformers calls SDPA with ``enable_gqa``) ended in an internal error: seen on an H100 with torch
2.11 (benchmarks/results/gpu_check-H100-SXM.part4.md). Here the old counter is put back in place
and the profiler's counting must still give the broadcast kernel's FLOPs.
"""

from __future__ import annotations

import pytest
import torch
import torch.utils.flop_counter as flop_counter
from torch.nn.functional import scaled_dot_product_attention
from torch.utils.flop_counter import FlopCounterMode

from hetplan.profile.measure import _gqa_flop_counting, broadcast_kv_heads

B, HQ, HKV, S, D = 2, 8, 2, 16, 4


def _strict(query_shape, key_shape, value_shape):
    """torch 2.11's counter: equal heads or an AssertionError."""
    b, h, s_q, d = query_shape
    _b, h_k, s_k, _d = key_shape
    if not (b == _b and h == h_k == value_shape[1] and d == _d and s_k == value_shape[2]):
        raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
    return 2 * b * h * s_q * d * s_k + 2 * b * h * s_q * s_k * value_shape[3]


def _count_gqa() -> int:
    """The FLOPs torch's counter gives the GPU's fused kernels (the formula it registers for them,
    which looks up ``sdpa_flop_count`` when called), for grouped-query shapes."""
    return flop_counter.sdpa_flop((B, HQ, S, D), (B, HKV, S, D), (B, HKV, S, D), out_val=None)


def test_an_old_counter_refuses_gqa_and_the_profiler_counts_it_broadcast(monkeypatch) -> None:
    monkeypatch.setattr(flop_counter, "sdpa_flop_count", _strict)
    with pytest.raises(AssertionError):
        _count_gqa()
    with _gqa_flop_counting():
        counted = _count_gqa()
    assert counted == 2 * (2 * B * HQ * S * D * S)  # scores and output, every query head
    assert flop_counter.sdpa_flop_count is _strict  # put back afterwards


def test_a_counter_that_knows_gqa_is_left_alone() -> None:
    before = flop_counter.sdpa_flop_count
    with _gqa_flop_counting():
        assert flop_counter.sdpa_flop_count is before
        counted = _count_gqa()
    assert counted == 2 * (2 * B * HQ * S * D * S)


def test_broadcast_shapes() -> None:
    assert broadcast_kv_heads((2, 8, 16, 4), (2, 2, 16, 4), (2, 2, 16, 4)) == (
        (2, 8, 16, 4),
        (2, 8, 16, 4),
        (2, 8, 16, 4),
    )


def test_the_cpu_fused_attention_kernel_is_counted() -> None:
    """torch's counter alone counts 0 FLOPs for the CPU's fused SDPA kernel."""
    from hetplan.profile.measure import _cpu_sdpa

    q = torch.randn(B, HQ, S, D)
    k, v = torch.randn(B, HKV, S, D), torch.randn(B, HKV, S, D)
    with FlopCounterMode(display=False, custom_mapping=_cpu_sdpa()) as counter:
        scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert counter.get_total_flops() == 2 * (2 * B * HQ * S * D * S)

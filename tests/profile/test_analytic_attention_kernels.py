"""The attention kernel is a model setting, and the analytic profile keeps what the zoo keeps.

The zoo GPT is measured block by block (:func:`measure_profile`: the bytes autograd saves for
backward) with the core written out (``attention: unfused``: the softmax output, a·s²·d) and with
``scaled_dot_product_attention`` (``fused``: the fp32 logsumexp, a·s·4, no s² tensor); the analytic
attention block must match each within 5%, at fp32 and bf16.
"""

from __future__ import annotations

import pytest

from hetplan.errors import HetplanError
from hetplan.families import get_spec
from hetplan.profile.analytic import FAMILIES
from hetplan.profile.analytic.transformer import attention_core_bytes

# seq 128 against hidden 64: the s² term dominates the attention block, so a wrong kernel shows
CONFIG = {"layers": 1, "hidden": 64, "heads": 4, "seq": 128, "vocab": 256}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kernel", ["unfused", "fused"])
def test_analytic_activations_match_the_measured_zoo(kernel: str, dtype: str) -> None:
    from hetplan.profile.measure import measure_profile

    config = {**CONFIG, "attention": kernel}
    measured = measure_profile(
        {"family": "gpt", "config": config}, micro_batches=(1, 2), warmup=1, repeat=1, dtype=dtype
    )
    analytic = FAMILIES["gpt"].blocks(config, dtype)
    got = {b.name: b.activation_bytes for b in measured.blocks}
    want = {b.name: b.activation_bytes for b in analytic}
    # the head: LN inputs and the loss's fp32 log-softmax over the logits
    for name in ("layer0.attn", "layer0.mlp", "head"):
        assert got[name] == pytest.approx(want[name], rel=0.03), name


def test_the_settings_differ_by_the_tensors_they_keep() -> None:
    s, h, a = CONFIG["seq"], CONFIG["hidden"], CONFIG["heads"]

    def attn(**settings):
        return FAMILIES["gpt"].blocks({**CONFIG, **settings}, "bf16")[1]

    unfused, fused = attn(attention="unfused"), attn(attention="fused")
    assert unfused.activation_bytes - fused.activation_bytes == pytest.approx(a * s * s * 2 - a * s * 4)
    # dropout: the softmax's dropout output and mask (a·s²·3 at 2 bytes) and the residual mask s·h
    with_dropout = attn(attention="unfused", dropout="on")
    assert with_dropout.activation_bytes - unfused.activation_bytes == pytest.approx(a * s * s * 3 + s * h)
    # a fused kernel regenerates its dropout mask: only the residual mask is added
    assert attn(attention="fused", dropout="on").activation_bytes - fused.activation_bytes == s * h
    assert attention_core_bytes(seq=s, heads=a, dtype_bytes=2, tp=2, kernel="fused") == a * s * 4 / 2
    # selective recomputation drops exactly the kernel's core tensors
    assert fused.selective_bytes == a * s * 4


def test_tensor_parallel_blocks_follow_the_kernel() -> None:
    unfused = FAMILIES["gpt"].blocks_at({**CONFIG, "attention": "unfused"}, "fp32", 2)[1]
    fused = FAMILIES["gpt"].blocks_at({**CONFIG, "attention": "fused"}, "fp32", 2)[1]
    s, a = CONFIG["seq"], CONFIG["heads"]
    assert unfused.activation_bytes - fused.activation_bytes == pytest.approx((a * s * s * 4 - a * s * 4) / 2)


def test_unknown_settings_are_refused_at_their_field() -> None:
    for key, value in (("attention", "flash3"), ("dropout", "maybe"), ("attention", 1)):
        with pytest.raises(HetplanError) as info:
            get_spec("gpt").full_config({key: value})
        assert info.value.field == f"config.{key}"
    assert get_spec("bert").full_config({})["dropout"] == "on"


def test_the_zoo_refuses_dropout_it_does_not_have() -> None:
    from hetplan.models.gpt import GptModel

    with pytest.raises(HetplanError) as info:
        GptModel(get_spec("gpt").full_config({**CONFIG, "dropout": "on"}))
    assert info.value.field == "config.dropout"

"""The analytic GPT's embedding and head at tensor-parallel degree t: vocabulary-parallel (Megatron's).

Each member keeps ceil(V/t) rows of the token table and of the LM head, 1/t of the logits and of
the loss's softmax, and all-reduces once in each block; the memory walk holds a vocabulary-parallel
head's logits at 1/t. BERT's embedding and head stay replicated.
"""

from __future__ import annotations

import pytest

from hetplan.contracts import load_catalog
from hetplan.profile.analytic import analytic_profile
from hetplan.simulate.memory import held_output_bytes, stage_terms

S, H, V = 16, 64, 100
SMALL = {"layers": 2, "hidden": H, "heads": 4, "seq": S, "vocab": V}


def _profile(dtype: str = "fp32", family: str = "gpt", config=None):
    devices = [load_catalog().get("A100-40GB")]
    return analytic_profile(family, config or SMALL, devices=devices, dtype=dtype, tp_degrees=(1, 2, 4, 3))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_embedding_and_head_keep_their_rows_of_the_vocabulary(dtype: str) -> None:
    d = 4 if dtype == "fp32" else 2
    profile = _profile(dtype)
    embedding, head = profile.blocks[0], profile.blocks[-1]
    a100 = load_catalog().get("A100-40GB")
    for t in (2, 4):
        n = -(-V // t)  # 50, 25
        e, h = embedding.shard(t), head.shard(t)
        assert (e.params, e.param_bytes) == (n * H + S * H, float((n * H + S * H) * d))
        assert h.params == 2 * H + n * H
        assert h.activation_bytes == pytest.approx(2 * S * H * d + S * n * 4)  # LN inputs, the fp32 softmax
        assert e.allreduce_bytes == pytest.approx(S * H * d / 2)  # the output, forward only
        assert h.allreduce_bytes == pytest.approx((S * H * d + 3 * S * 4) / 2)  # input gradient + row stats
        assert held_output_bytes(profile, len(profile.blocks), t) == pytest.approx(S * V * d / t)
        fwd, _ = profile.block_time(len(profile.blocks) - 1, a100, 4, t)
        assert fwd < profile.block_time(len(profile.blocks) - 1, a100, 4)[0]
    # degree 3 does not divide 4 heads: no degree-3 figures at all
    assert 3 not in profile.tp_degrees(0)


def test_a_last_stage_holds_its_slice_of_the_logits_and_a_middle_stage_its_whole_output() -> None:
    profile = _profile()
    n = len(profile.blocks)
    whole, half = stage_terms(profile, 1, n), stage_terms(profile, 1, n, tp=2)
    logits = S * V * 4
    head_saved = profile.blocks[-1].activation_bytes - profile.blocks[-1].shard(2).activation_bytes
    blocks = profile.blocks
    layers = sum(blocks[b].activation_bytes - blocks[b].shard(2).activation_bytes for b in range(1, n - 1))
    assert whole.held_per_sample - half.held_per_sample == pytest.approx(logits / 2 + head_saved + layers)
    assert held_output_bytes(profile, n - 1, 2) == profile.blocks[n - 2].output_bytes  # a layer's: whole


def test_bert_keeps_its_embedding_and_head_whole() -> None:
    profile = _profile(family="bert", config={"layers": 1, "hidden": H, "heads": 4, "seq": S})
    for i in (0, len(profile.blocks) - 1):
        block = profile.blocks[i]
        assert (block.shard(2).params, block.shard(2).allreduce_bytes) == (block.params, 0.0)
    assert held_output_bytes(profile, len(profile.blocks), 2) == profile.blocks[-1].output_bytes

"""The measured profile at tensor-parallel degrees: each block's per-degree shard figures and times."""

from __future__ import annotations

import pytest

from hetplan.contracts.model_profile import load_profile
from hetplan.errors import HetplanError
from hetplan.profile.measure import measure_profile
from hetplan.profile.request import measure_request

H, S = 32, 8
GPT = {"family": "gpt", "config": {"layers": 1, "hidden": H, "heads": 4, "seq": S, "vocab": 31}}


def test_blocks_are_measured_at_degrees_2_and_4_with_the_runtime_shards(tmp_path) -> None:
    profile = measure_request(
        GPT,
        micro_batches=(1, 2),
        device="cpu",
        dtype="fp32",
        threads=1,
        warmup=1,
        repeat=1,
        estimate_for=(),
        device_type=None,
        tensor_parallel=(2, 4),
    )
    embedding, attn, mlp, head = profile.blocks
    for t in (2, 4):
        # column-parallel QKV (weight and bias cut), row-parallel proj (weight cut, bias whole), LayerNorm whole
        assert attn.tensor_parallel[t].params == (H * 3 * H + 3 * H) // t + H * H // t + H + 2 * H
        assert mlp.tensor_parallel[t].params == (H * 4 * H + 4 * H) // t + 4 * H * H // t + H + 2 * H
        for block in (attn, mlp):
            data = block.tensor_parallel[t]
            assert data.allreduce_bytes == S * H * 4  # the block's output, fp32, per sample
            assert 0 < data.activation_bytes < block.activation_bytes
            assert set(data.times["cpu"]) == {1, 2} and data.times["cpu"][2].fwd > 0
        # vocabulary-parallel (the runtime's default cut): ceil(V/t) rows of the token table and head
        rows = -(-31 // t)
        assert embedding.tensor_parallel[t].params == rows * H + S * H  # position table whole
        assert embedding.tensor_parallel[t].allreduce_bytes == S * H * 4 / 2  # the output, forward only
        assert head.tensor_parallel[t].params == rows * H + 2 * H  # final LayerNorm whole
        # backward: the input gradient; forward: max, target logit, sum of exponentials per token
        assert head.tensor_parallel[t].allreduce_bytes == (S * H * 4 + 3 * 4 * S) / 2
        assert 0 < head.tensor_parallel[t].activation_bytes < head.activation_bytes
        assert head.tensor_parallel[t].times["cpu"][2].fwd > 0
    assert attn.selective_bytes > attn.tensor_parallel[2].selective_bytes > attn.tensor_parallel[4].selective_bytes > 0
    assert mlp.selective_bytes == 0.0
    profile.save(tmp_path / "p.yaml")
    again = load_profile(tmp_path / "p.yaml")
    assert (
        again.tp_degrees(1) == (1, 2, 4) and again.blocks[1].tensor_parallel[4].params == attn.tensor_parallel[4].params
    )


def test_a_bad_degree_is_refused() -> None:
    with pytest.raises(HetplanError, match="tensor-parallel"):
        measure_profile(GPT, micro_batches=(1,), warmup=1, repeat=1, tensor_parallel=(0,))

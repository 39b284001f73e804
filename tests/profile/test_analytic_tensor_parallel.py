"""Analytic estimates per tensor-parallel degree: Megatron's split by hand-computed numbers, the
Korthikanti et al. 2022 activation formula, times priced by the achieved-efficiency model (not an
ideal 1/t), selective recomputation's bytes and time."""

from __future__ import annotations

import pytest

from hetplan.contracts import load_catalog
from hetplan.contracts.model_profile import parse_profile
from hetplan.errors import HetplanError
from hetplan.profile.analytic import FAMILIES, analytic_profile
from hetplan.profile.roofline import Efficiency

SMALL = {"layers": 2, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100}


def _profile(config=SMALL, dtype="fp16", **kwargs):
    catalog = load_catalog()
    devices = [catalog.get("A100-40GB"), catalog.get("V100-16GB")]
    return analytic_profile("gpt", config, devices=devices, dtype=dtype, **kwargs)


def test_degrees_divide_heads_and_ffn() -> None:
    profile = _profile()
    for i in range(len(profile.blocks)):
        assert profile.tp_degrees(i) == (1, 2, 4)  # 4 heads: degree 8 would split a head
    three = _profile(tp_degrees=(1, 3))
    assert all(three.tp_degrees(i) == (1,) for i in range(len(three.blocks)))
    with pytest.raises(HetplanError, match="tensor-parallel degrees"):
        _profile(tp_degrees=(0, 2))


def test_per_device_params_and_activations_at_degree_2_by_hand() -> None:
    profile = _profile({**SMALL, "dropout": "on"})  # Korthikanti's layer: unfused attention, dropout
    attn, mlp = profile.blocks[1], profile.blocks[2]
    two_attn, two_mlp = attn.tensor_parallel[2], mlp.tensor_parallel[2]
    # h = 64, f = 256, s = 16, a = 4, d = 2, t = 2
    # attention: LN 2h + (QKV 3h² + 3h) / 2 + (output h²) / 2 + output bias h = 128 + 6240 + 2048 + 64
    assert two_attn.params == 8480 and two_attn.param_bytes == 2 * 8480
    # MLP: LN 2h + (up h·f + f) / 2 + (down f·h) / 2 + down bias h = 128 + 8320 + 8192 + 64
    assert two_mlp.params == 16704
    assert two_attn.params + two_mlp.params == (12 * 64 * 64 + 7 * 64) // 2 + 6 * 64
    # activations: attention s·h·(2d+1) + 4·s·h·d/t + a·s²·(2d+1)/t = 5120 + 4096 + 2560
    assert two_attn.activation_bytes == 11776 and two_attn.selective_bytes == 2560
    # MLP: s·h·(2d+1) + 2·s·f·d/t = 5120 + 8192
    assert two_mlp.activation_bytes == 13312 and two_mlp.selective_bytes == 0
    # together Korthikanti's per-layer s·h·(10 + 24/t + 5·a·s/(h·t)) at 2 bytes
    assert two_attn.activation_bytes + two_mlp.activation_bytes == 16 * 64 * (10 + 24 / 2 + 5 * 4 * 16 / (64 * 2))
    assert two_attn.allreduce_bytes == two_mlp.allreduce_bytes == 16 * 64 * 2  # s·h·d per sample
    # degree 1 is the whole block: the same formula at t = 1, selective bytes a·s²·(2d+1)
    assert attn.activation_bytes + mlp.activation_bytes == 16 * 64 * (34 + 5 * 4 * 16 / 64)
    assert attn.selective_bytes == 4 * 16 * 16 * 5 and attn.params == 4 * 64 * 64 + 6 * 64


@pytest.mark.parametrize("t", [2, 4, 8])
def test_seven_b_layer_activations_follow_korthikanti(t: int) -> None:
    config = {"layers": 1, "hidden": 4096, "heads": 32, "seq": 4096, "dropout": "on"}  # the paper's layer
    catalog = load_catalog()
    profile = analytic_profile("gpt", config, devices=[catalog.get("A100-40GB")], dtype="fp16", micro_batches=(1,))
    s, h, a = 4096, 4096, 32
    layer = profile.shard(1, t).activation_bytes + profile.shard(2, t).activation_bytes
    assert layer == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)


def test_times_at_a_degree_are_above_an_ideal_split_for_small_gemms() -> None:
    profile = _profile()
    catalog = load_catalog()
    for name in ("A100-40GB", "V100-16GB"):
        device = catalog.get(name)
        for i in (1, 2):
            for m in (1, 8):
                f1, b1 = profile.block_time(i, device, m)
                f2, b2 = profile.block_time(i, device, m, tp=2)
                f4, _ = profile.block_time(i, device, m, tp=4)
                assert f1 / 2 < f2 < f1 and b1 / 2 < b2 < b1  # smaller GEMMs fill fewer SMs; LN stays whole
                assert f2 / 2 < f4 < f2


def test_selective_recompute_time_is_the_attention_core_share_of_the_forward() -> None:
    profile = _profile()
    catalog = load_catalog()
    device = catalog.get("A100-40GB")
    for t in (1, 2, 4):
        fwd, _ = profile.block_time(1, device, 4, tp=t)
        core = profile.recompute_time(1, device, 4, tp=t)
        assert 0 < core < fwd
        assert profile.recompute_time(2, device, 4, tp=t) == 0.0  # the MLP drops nothing
    legacy = _profile(efficiency=Efficiency())
    fwd, _ = legacy.block_time(1, device, 4, tp=2)
    assert 0 < legacy.recompute_time(1, device, 4, tp=2) < fwd


def test_the_profile_round_trips_through_the_contract() -> None:
    profile = _profile()
    again = parse_profile(profile.to_dict())
    assert again.to_dict() == profile.to_dict()
    assert again.tp_degrees(1) == (1, 2, 4)


def test_bert_layers_split_too_and_other_families_do_not() -> None:
    catalog = load_catalog()
    a100 = [catalog.get("A100-40GB")]
    bert = analytic_profile("bert", {"layers": 1, "hidden": 64, "heads": 4, "seq": 16}, devices=a100)
    assert bert.tp_degrees(1) == (1, 2, 4) and bert.tp_degrees(0) == (1, 2, 4)
    mlp = analytic_profile("mlp", {}, devices=a100)
    assert all(mlp.tp_degrees(i) == (1,) for i in range(len(mlp.blocks)))
    assert FAMILIES["resnet"].blocks_at({}, "fp32", 2) == [None] * len(FAMILIES["resnet"].blocks({}))


def test_carrying_times_to_another_type_keeps_degrees_and_the_recompute_share() -> None:
    from hetplan.profile.carry import carry_times

    catalog = load_catalog()
    a100, v100 = catalog.get("A100-40GB"), catalog.get("V100-16GB")
    profile = analytic_profile("gpt", SMALL, devices=[a100], dtype="fp16")
    carried = carry_times(profile, "A100-40GB", [v100], catalog=catalog)
    for t in (1, 2, 4):
        fwd_a, _ = carried.block_time(1, a100, 2, tp=t)
        fwd_v, _ = carried.block_time(1, v100, 2, tp=t)
        assert fwd_v > fwd_a  # the slower type, at every degree
        share = carried.recompute_time(1, a100, 2, tp=t) / fwd_a
        assert carried.recompute_time(1, v100, 2, tp=t) / fwd_v == pytest.approx(share)

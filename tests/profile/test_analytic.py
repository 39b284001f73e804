"""Analytic profiles against published figures and against their own closed forms.

Published figures: GPT-2 small 124,439,808 parameters with the LM head tied (Radford et al. 2019,
Hugging Face ``gpt2``); BERT-base 109,482,240 (``BertModel``) and 110,106,428 with the pre-training
heads tied (``BertForPreTraining``); torchvision's resnet18/50/101 and vgg16/19 parameter counts and
"GFLOPS" (which count multiply-adds: 1.81, 4.09, 7.80, 15.47, 19.63 G).
"""

from __future__ import annotations

import itertools

import pytest

from hetplan.contracts.catalog import DeviceType
from hetplan.contracts.model_profile import parse_profile
from hetplan.errors import HetplanError
from hetplan.profile.analytic import FAMILIES, BlockCost, analytic_profile
from hetplan.profile.roofline import Efficiency

GiB = 2**30
A100 = DeviceType("A100-80GB", 80 * GiB, 2039e9, {"fp32": 19.5e12, "tf32": 156e12, "fp16": 312e12, "bf16": 312e12})
V100 = DeviceType("V100-16GB", 16 * GiB, 900e9, {"fp32": 15.7e12, "fp16": 125e12})
T4 = DeviceType("T4", 16 * GiB, 320e9, {"fp32": 8.1e12, "fp16": 65e12})
DEVICES = [A100, V100, T4]


def costs(family: str, config: dict | None = None, dtype: str = "fp32") -> list[BlockCost]:
    return FAMILIES[family].blocks(config, dtype)


def total(blocks: list[BlockCost], attr: str) -> float:
    return sum(getattr(b, attr) for b in blocks)


# -- transformers -----------------------------------------------------------------------------


def test_gpt_block_order_and_names() -> None:
    names = [b.name for b in costs("gpt", {"layers": 2})]
    assert names == ["embedding", "layer0.attn", "layer0.mlp", "layer1.attn", "layer1.mlp", "head"]
    kinds = {b.kind for b in costs("gpt", {"layers": 2})}
    assert kinds == {"embedding", "attention", "mlp", "head"}


def test_gpt_flops_exact_against_closed_form() -> None:
    n_layers, h, a, s, v = 3, 256, 4, 64, 1000
    blocks = costs("gpt", {"layers": n_layers, "hidden": h, "heads": a, "seq": s, "vocab": v})
    expected = n_layers * (24 * s * h * h + 4 * s * s * h) + 2 * s * h * v
    assert total(blocks, "flops_fwd") == pytest.approx(expected, rel=1e-12)
    attn = blocks[1]
    assert attn.flops_fwd == pytest.approx(8 * s * h * h + 2 * 2 * s * s * h, rel=1e-12)


def test_gpt_layer_flops_near_two_flops_per_param_per_token() -> None:
    """Kaplan et al. 2020: forward ≈ 2 × non-embedding params × tokens when seq ≪ hidden."""
    s, h = 128, 2048
    blocks = costs("gpt", {"layers": 4, "hidden": h, "heads": 16, "seq": s, "vocab": 50257})
    layers = [b for b in blocks if b.kind in ("attention", "mlp")]
    approx = 2 * total(layers, "params") * s
    assert total(layers, "flops_fwd") == pytest.approx(approx, rel=0.10)
    assert total(layers, "flops_fwd") >= 0.99 * approx  # attention scores only add
    head = blocks[-1]
    assert head.flops_fwd == pytest.approx(2 * (head.params - 2 * h) * s)  # LM head matmul


def test_gpt2_small_params_with_untied_head() -> None:
    h, v = 768, 50257
    blocks = costs("gpt", {"layers": 12, "hidden": h, "heads": 12, "seq": 1024, "vocab": v})
    params = total(blocks, "params")
    # the untied LM head adds V·h on top of GPT-2's (tied) 124,439,808
    assert params - v * h == 124_439_808
    assert params - v * h == pytest.approx(124e6, rel=0.01)
    assert blocks[-1].params == 2 * h + v * h


def test_bert_base_params() -> None:
    blocks = costs("bert")
    h, v = 768, 30522
    pooler = h * h + h
    encoder = total(blocks[:-1], "params") + pooler
    assert encoder == 109_482_240  # BertModel
    assert encoder == pytest.approx(110e6, rel=0.01)
    assert total(blocks, "params") - v * h == 110_106_428  # BertForPreTraining, decoder tied


def test_bert_layer_flops_match_gpt() -> None:
    cfg = {"layers": 2, "hidden": 512, "heads": 8, "seq": 128, "vocab": 1000}
    gpt = costs("gpt", cfg)
    bert = costs("bert", cfg)
    assert [b.flops_fwd for b in gpt[1:-1]] == [b.flops_fwd for b in bert[1:-1]]


def test_korthikanti_activation_bytes_at_two_bytes() -> None:
    s, h, a = 512, 1024, 16
    config = {"layers": 1, "hidden": h, "heads": a, "seq": s, "vocab": 1000}
    blocks = costs("gpt", {**config, "dropout": "on"}, "fp16")  # the paper's layer: unfused, with dropout
    per_layer = blocks[1].activation_bytes + blocks[2].activation_bytes
    assert per_layer == pytest.approx(s * h * (34 + 5 * a * s / h), rel=1e-12)
    # without dropout (the default, as the zoo): no masks (a·s² + 2·s·h) and no softmax dropout output
    plain = costs("gpt", config, "fp16")
    assert plain[1].activation_bytes + plain[2].activation_bytes == pytest.approx(s * h * 32 + 2 * a * s * s)


def test_transformer_output_bytes() -> None:
    s, h, v = 64, 256, 1000
    for dtype, d in (("fp32", 4), ("bf16", 2)):
        blocks = costs("gpt", {"layers": 2, "hidden": h, "heads": 4, "seq": s, "vocab": v}, dtype)
        assert all(b.output_bytes == s * h * d for b in blocks[:-1])
        assert blocks[-1].output_bytes == s * v * d  # the head returns the logits


# -- convolutional networks -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("depth", "params", "gmacs"),
    [(18, 11_689_512, 1.81), (50, 25_557_032, 4.1), (101, 44_549_160, 7.8)],
)
def test_resnet_against_torchvision(depth: int, params: int, gmacs: float) -> None:
    blocks = costs("resnet", {"depth": depth})
    assert total(blocks, "params") == pytest.approx(params, rel=0.01)
    assert total(blocks, "params") == params  # exact: every conv, BN and the FC counted
    macs = total(blocks, "flops_fwd") / 2  # FLOPs are 2 per multiply-add
    assert macs == pytest.approx(gmacs * 1e9, rel=0.05)


def test_resnet50_block_structure() -> None:
    blocks = costs("resnet", {"depth": 50})
    assert blocks[0].name == "stem" and blocks[-1].name == "head"
    assert len(blocks) == 1 + 3 + 4 + 6 + 3 + 1
    assert blocks[1].name == "layer1.0" and blocks[1].kind == "bottleneck"
    assert blocks[-2].output_bytes == 2048 * 7 * 7 * 4
    assert blocks[-1].output_bytes == 1000 * 4


@pytest.mark.parametrize(("depth", "params", "gmacs"), [(16, 138_357_544, 15.5), (19, 143_667_240, 19.6)])
def test_vgg_against_torchvision(depth: int, params: int, gmacs: float) -> None:
    blocks = costs("vgg", {"depth": depth})
    assert total(blocks, "params") == params
    assert total(blocks, "flops_fwd") / 2 == pytest.approx(gmacs * 1e9, rel=0.05)
    assert [b.name for b in blocks[-3:]] == ["fc6", "fc7", "fc8"]
    assert len(blocks) == depth  # 13 or 16 convolutions + 3 FC layers


def test_vgg_pools_fold_into_the_stage_last_conv() -> None:
    blocks = {b.name: b for b in costs("vgg", {"depth": 16})}
    assert blocks["conv1_1"].output_bytes == 64 * 224 * 224 * 4
    assert blocks["conv1_2"].output_bytes == 64 * 112 * 112 * 4
    assert blocks["conv5_3"].output_bytes == 512 * 7 * 7 * 4


def test_mlp_params_and_blocks() -> None:
    blocks = costs("mlp", {"layers": 3, "width": 100, "input": 20, "classes": 5})
    assert [b.name for b in blocks] == ["layer0", "layer1", "layer2"]
    assert [b.params for b in blocks] == [20 * 100 + 100, 100 * 100 + 100, 100 * 5 + 5]
    assert [b.flops_fwd for b in blocks] == [2 * 20 * 100, 2 * 100 * 100, 2 * 100 * 5]


# -- dtype and bytes --------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_dtype_changes_bytes_not_flops(family: str) -> None:
    wide = costs(family, None, "fp32")
    narrow = costs(family, None, "fp16")
    for w, n in zip(wide, narrow, strict=True):
        assert w.flops_fwd == n.flops_fwd and w.params == n.params
        assert w.param_bytes == 4 * w.params and n.param_bytes == 2 * n.params
        assert n.output_bytes * 2 == w.output_bytes
        # 1-byte masks and int64 indices do not shrink with the dtype (GPT's embedding keeps only a mask)
        assert w.activation_bytes / 2 <= n.activation_bytes <= w.activation_bytes
    assert total(narrow, "activation_bytes") < total(wide, "activation_bytes")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_weights_are_read_once_per_micro_batch(family: str) -> None:
    for b in costs(family):
        assert b.bytes_moved(8) - b.bytes_moved(1) == pytest.approx(7 * b.activation_traffic)
        assert b.bytes_moved(1) == pytest.approx(b.weight_traffic + b.activation_traffic)
        if b.kind not in ("embedding",):
            assert b.weight_traffic == b.param_bytes


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_parts_add_up_to_the_block_and_split_work_by_kind(family: str) -> None:
    for dtype in ("fp32", "fp16"):
        for b in costs(family, None, dtype):
            parts = b.works()
            assert b.parts, b.name  # every family splits its blocks
            assert sum(p.flops for p in parts) == pytest.approx(b.flops_fwd, rel=1e-12)
            assert sum(p.traffic for p in parts) == pytest.approx(b.activation_traffic, rel=1e-12)
            assert sum(p.weight_traffic for p in parts) == pytest.approx(b.weight_traffic, rel=1e-12)
            assert sum(p.kernels for p in parts) == b.kernels
            assert all(p.flops == 0 for p in parts if p.kind == "memory")


def test_transformer_sub_blocks_have_gemm_attention_and_memory_work() -> None:
    blocks = costs("gpt", {"layers": 1, "hidden": 512, "heads": 8, "seq": 256}, "fp16")
    attn, mlp = blocks[1], blocks[2]
    assert [p.kind for p in attn.parts] == ["gemm", "attention", "attention", "gemm", "memory", "memory"]
    assert [p.kind for p in mlp.parts] == ["gemm", "gemm", "memory"]
    s, h = 256, 512
    assert sum(p.flops for p in attn.parts if p.kind == "attention") == pytest.approx(4 * s * s * h)
    assert blocks[0].parts[0].kind == "memory" and blocks[-1].parts[1].kind == "gemm"
    conv = costs("resnet", {"depth": 50})[1]
    assert {p.kind for p in conv.parts} == {"gemm", "memory"}


def test_a_block_cost_whose_parts_do_not_add_up_is_refused() -> None:
    b = costs("gpt", {"layers": 1})[1]
    with pytest.raises(HetplanError, match="add up"):
        BlockCost(**{**b.__dict__, "flops_fwd": b.flops_fwd * 2})


# -- times --------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_times_positive_monotone_and_ordered_by_device(family: str) -> None:
    profile = analytic_profile(family, devices=DEVICES, dtype="fp16", micro_batches=(1, 2, 4, 8, 32))
    for block in profile.blocks:
        for device in DEVICES:
            points = block.times[device.name]
            sizes = sorted(points)
            for m0, m1 in itertools.pairwise(sizes):
                t0, t1 = points[m0], points[m1]
                assert 0 < t0.fwd < t1.fwd and 0 < t0.bwd < t1.bwd
                assert t1.fwd / m1 <= t0.fwd / m0 * (1 + 1e-12)
                assert t1.bwd / m1 <= t0.bwd / m0 * (1 + 1e-12)
            assert all(t.source == "estimated" for t in points.values())
        for m in (1, 8, 32):
            a, v, t = (block.times[d.name][m] for d in DEVICES)
            assert a.fwd < v.fwd < t.fwd, block.name
            assert a.bwd < v.bwd < t.bwd, block.name


def test_per_sample_time_falls_with_micro_batch_for_a_gemm_block() -> None:
    profile = analytic_profile("gpt", {"seq": 128}, devices=[A100], dtype="fp16", micro_batches=(1, 8))
    mlp = profile.blocks[2].times[A100.name]
    assert mlp[8].fwd / 8 < 0.6 * mlp[1].fwd  # efficiency curve + launch overhead amortised


def test_fp16_faster_than_fp32_on_tensor_cores() -> None:
    fp32 = analytic_profile("gpt", devices=[A100], dtype="fp32")
    fp16 = analytic_profile("gpt", devices=[A100], dtype="fp16")
    for b32, b16 in zip(fp32.blocks, fp16.blocks, strict=True):
        for m in (1, 8):
            assert b16.times[A100.name][m].fwd < b32.times[A100.name][m].fwd
            assert b16.times[A100.name][m].bwd < b32.times[A100.name][m].bwd


def test_backward_is_twice_forward_for_dense_blocks() -> None:
    profile = analytic_profile("resnet", devices=[V100])
    for block in profile.blocks:
        for t in block.times[V100.name].values():
            assert t.bwd == pytest.approx(2 * t.fwd)


def test_efficiency_constants_change_times_and_are_recorded() -> None:
    """The single-roof model of earlier profiles is reproduced on request, and says so."""
    slow = Efficiency(compute_max=0.3)
    legacy = analytic_profile("vgg", devices=[A100], efficiency=Efficiency())
    worse = analytic_profile("vgg", devices=[A100], efficiency=slow)
    assert worse.blocks[1].times[A100.name][8].fwd > legacy.blocks[1].times[A100.name][8].fwd
    assert worse.source["efficiency"]["compute_max"] == 0.3
    assert worse.source["efficiency"]["model"] == "single roof (legacy)"
    assert worse.source["tool"] == "hetplan analytic"


def test_default_times_record_the_achieved_figures_per_device() -> None:
    from dataclasses import replace

    from hetplan.contracts.catalog import AchievedEfficiency

    figs = AchievedEfficiency(gemm={"fp32": 0.8, "fp16": 0.6}, attention=0.5, memory=0.8, launch_s=5e-6, sms=108)
    stated = replace(A100, efficiency=figs)
    slower = replace(A100, efficiency=replace(figs, gemm={"fp32": 0.4, "fp16": 0.3}))
    base = analytic_profile("vgg", devices=[stated])
    worse = analytic_profile("vgg", devices=[slower])
    assert worse.blocks[1].times[A100.name][8].fwd > base.blocks[1].times[A100.name][8].fwd
    note = base.source["efficiency"]["devices"][A100.name]
    assert note["gemm"] == {"fp32": 0.8, "fp16": 0.6} and note["gemm_tflops"] == pytest.approx(0.8 * 19.5)


def test_profile_contract_round_trip() -> None:
    profile = analytic_profile("gpt", {"layers": 2}, devices=[A100, V100], dtype="bf16")
    assert profile.model == {"family": "gpt", "config": {**FAMILIES["gpt"].defaults, "layers": 2}}
    assert profile.input_bytes == 256 * 8
    again = parse_profile(profile.to_dict())
    assert [b.name for b in again.blocks] == [b.name for b in profile.blocks]
    assert again.device_types() == ["A100-80GB", "V100-16GB"]
    fwd, bwd = again.block_time(1, A100, 3)
    lo, hi = profile.blocks[1].times[A100.name][2], profile.blocks[1].times[A100.name][4]
    assert lo.fwd < fwd < hi.fwd and lo.bwd < bwd < hi.bwd


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "config", "field"),
    [
        ("gpt", {"heads": 5}, "config.heads"),
        ("gpt", {"layers": 0}, "config.layers"),
        ("gpt", {"hidden": -768}, "config.hidden"),
        ("gpt", {"seq": "256"}, "config.seq"),
        ("gpt", {"vocab": True}, "config.vocab"),
        ("gpt", {"vocab": 1.5}, "config.vocab"),
        ("gpt", {"hiden": 512}, "config.hiden"),
        ("bert", {"seq": 1024}, "config.seq"),
        ("bert", {"heads": 7}, "config.heads"),
        ("resnet", {"depth": 20}, "config.depth"),
        ("resnet", {"classes": 0}, "config.classes"),
        ("vgg", {"depth": 11}, "config.depth"),
        ("vgg", {"image_size": 16}, "config.image_size"),
        ("mlp", {"width": 0}, "config.width"),
        ("transformer", {}, "family"),
    ],
)
def test_bad_config_names_the_field(family: str, config: dict, field: str) -> None:
    with pytest.raises(HetplanError) as err:
        analytic_profile(family, config, devices=[A100])
    assert err.value.field == field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"dtype": "int8"}, "dtype"),
        ({"micro_batches": ()}, "micro_batches"),
        ({"micro_batches": (1, 0)}, "micro_batches"),
        ({"devices": [A100, A100]}, "devices"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict, field: str) -> None:
    args = {"devices": [A100], **kwargs}
    with pytest.raises(HetplanError) as err:
        analytic_profile("mlp", **args)
    assert err.value.field == field


def test_unknown_key_suggests_the_close_one() -> None:
    with pytest.raises(HetplanError, match="did you mean 'hidden'"):
        FAMILIES["gpt"].full_config({"hiden": 512})


def test_families_declare_cli_defaults_and_help() -> None:
    assert set(FAMILIES) == {"gpt", "bert", "resnet", "vgg", "mlp"}
    assert set(FAMILIES["gpt"].defaults) == {
        "layers",
        "hidden",
        "heads",
        "seq",
        "vocab",
        "attention",
        "dropout",
        "head",
    }
    assert set(FAMILIES["resnet"].defaults) == {"depth", "image_size", "classes"}
    assert set(FAMILIES["vgg"].defaults) == {"depth", "image_size", "classes"}
    assert set(FAMILIES["mlp"].defaults) == {"layers", "width", "input", "classes"}
    for fam in FAMILIES.values():
        # integers, or named choices (the attention kernel, dropout)
        assert fam.help and all((isinstance(v, int) and v > 0) or isinstance(v, str) for v in fam.defaults.values())

"""Achieved efficiency: the figures per device type, the wave curve, each kind of work on its own
roof, and relative speeds of well-known pairs as published benchmarks order them."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from hetplan.contracts import load_catalog
from hetplan.contracts.catalog import AchievedEfficiency, DeviceType, parse_device_spec
from hetplan.contracts.fields import Fields
from hetplan.errors import HetplanError
from hetplan.profile.analytic import FAMILIES
from hetplan.profile.analytic.base import Work, gemm_work, memory_work
from hetplan.profile.analytic.transformer import attention_block, mlp_block
from hetplan.profile.efficiency import GENERIC, WAVE_HALF, achieved, figures, wave_saturation
from hetplan.profile.roofline import block_seconds, work_seconds

CATALOG = load_catalog()
GiB = 2**30
FIGS = AchievedEfficiency(gemm={"fp32": 0.8, "fp16": 0.5}, attention=0.5, memory=0.8, launch_s=0.0, sms=100)
GPU = DeviceType("GPU", 16 * GiB, 1000e9, {"fp32": 10e12, "fp16": 100e12}, efficiency=FIGS)


def layer(hidden: int = 2048, seq: int = 1024, d: int = 2) -> list:
    """A GEMM-heavy transformer layer (attention + MLP sub-blocks)."""
    return [
        attention_block("a", seq=seq, hidden=hidden, heads=hidden // 128, dtype_bytes=d),
        mlp_block("m", seq=seq, hidden=hidden, ffn=4 * hidden, dtype_bytes=d),
    ]


def step_seconds(name: str, dtype: str, m: int = 8, **kw) -> float:
    d = 2 if dtype in ("fp16", "bf16") else 4
    return sum(sum(block_seconds(c, CATALOG.get(name), dtype, m)) for c in layer(d=d, **kw))


# -- the wave curve -------------------------------------------------------------------------------


def test_wave_saturation_is_monotone_bounded_and_half_at_half_a_wave() -> None:
    values = [wave_saturation(t, 100) for t in (0, 1, 10, 50, 100, 400, 1e4, 1e8)]
    assert values[0] == 0.0
    assert all(a < b for a, b in itertools.pairwise(values))
    assert all(v < 1.0 for v in values) and values[-1] == pytest.approx(1.0, rel=1e-6)
    assert wave_saturation(WAVE_HALF * 100, 100) == pytest.approx(0.5)
    # the averaged wave quantization it stands for: 0.75 at 1.5 waves, 0.875 at 3.5
    assert wave_saturation(150, 100) == pytest.approx(0.75)
    assert wave_saturation(350, 100) == pytest.approx(0.875)
    with pytest.raises(HetplanError):
        wave_saturation(-1, 100)
    with pytest.raises(HetplanError):
        wave_saturation(1, 0)


def test_more_sms_need_more_tiles_to_fill() -> None:
    assert wave_saturation(100, 132) < wave_saturation(100, 80) < wave_saturation(100, 40)


# -- achieved rates ------------------------------------------------------------------------------


def test_achieved_rates_are_peaks_times_the_stated_fractions() -> None:
    a = achieved(GPU, "fp16")
    assert a.gemm_flops == pytest.approx(0.5 * 100e12)
    assert a.attention_flops == pytest.approx(0.5 * a.gemm_flops)
    assert a.bandwidth == pytest.approx(0.8 * 1000e9)
    # a dtype the type lacks runs at the fp32 peak with the fp32 figure (the catalog's fallback)
    for dtype in ("tf32", "bf16"):
        b = achieved(GPU, dtype)
        assert b.dtype == "fp32" and b.gemm_flops == pytest.approx(0.8 * 10e12)


def test_a_type_without_figures_gets_the_generic_ones() -> None:
    bare = replace(GPU, efficiency=None)
    assert figures(bare) is GENERIC
    assert achieved(bare, "fp16").gemm_flops == pytest.approx(GENERIC.gemm["fp16"] * 100e12)


def test_emulated_types_keep_their_base_figures() -> None:
    from hetplan.contracts.cluster import parse_cluster

    cluster = parse_cluster(
        {
            "schema": "hetplan/cluster/v1",
            "name": "emu",
            "nodes": [
                {
                    "name": "n0",
                    "devices": [{"type": "slow-v100", "count": 1, "emulate": {"base": "V100-16GB", "slowdown": 2}}],
                    "link": {"bandwidth": "16GB/s"},
                }
            ],
            "network": {"bandwidth": "10Gbps"},
        },
        file="emu.yaml",
    )
    emulated = cluster.devices[0].type
    base = CATALOG.get("V100-16GB")
    assert emulated.efficiency == base.efficiency
    assert achieved(emulated, "fp16").gemm_flops == pytest.approx(achieved(base, "fp16").gemm_flops / 2)


# -- each kind of work on its own roof ------------------------------------------------------------


def test_a_gemm_part_follows_the_gemm_figure_and_not_the_memory_one() -> None:
    work = gemm_work(4096, 4096, 4096, 2)  # compute-bound at any sane bandwidth
    t = work_seconds(work, 1, achieved(GPU, "fp16"))
    sat = wave_saturation(work.tiles, FIGS.sms)
    assert t == pytest.approx(work.flops / (0.5 * 100e12 * sat))
    faster_gemm = replace(GPU, efficiency=replace(FIGS, gemm={"fp32": 0.8, "fp16": 0.25}))
    more_memory = replace(GPU, efficiency=replace(FIGS, memory=0.4))
    assert work_seconds(work, 1, achieved(faster_gemm, "fp16")) == pytest.approx(2 * t)
    assert work_seconds(work, 1, achieved(more_memory, "fp16")) == pytest.approx(t)


def test_a_memory_part_follows_bandwidth_and_not_the_peak() -> None:
    work = memory_work(1e9, 3)
    t = work_seconds(work, 2, achieved(GPU, "fp16"))
    assert t == pytest.approx(2e9 / (0.8 * 1000e9))
    no_flops = replace(GPU, peak={"fp32": 1e12, "fp16": 2e12})
    assert work_seconds(work, 2, achieved(no_flops, "fp16")) == pytest.approx(t)
    launch = replace(GPU, efficiency=replace(FIGS, launch_s=1e-5))
    assert work_seconds(work, 2, achieved(launch, "fp16")) == pytest.approx(t + 3e-5)
    assert work_seconds(work, 2, achieved(launch, "fp16"), backward=True) == pytest.approx(2 * t + 6e-5)


def test_attention_matmuls_use_the_attention_factor() -> None:
    work = gemm_work(2048, 128, 2048, 4, batch=64, weights=False, kind="attention")
    gemm = replace(work, kind="gemm")
    rates = achieved(GPU, "fp32")  # compute-bound in fp32
    assert work_seconds(work, 1, rates) == pytest.approx(work_seconds(gemm, 1, rates) / FIGS.attention)


def test_a_block_is_the_sum_of_its_parts_and_backward_doubles_dense_work() -> None:
    block = layer()[0]
    rates = achieved(GPU, "fp16")
    fwd, bwd = block_seconds(block, GPU, "fp16", 4)
    assert fwd == pytest.approx(sum(work_seconds(w, 4, rates) for w in block.parts))
    assert bwd == pytest.approx(2 * fwd)
    assert {w.kind for w in block.parts} == {"gemm", "attention", "memory"}


@pytest.mark.parametrize("name", ["A100-80GB", "V100-16GB", "T4", "RTX-3090", "H100-SXM"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_per_sample_time_never_grows_and_total_time_grows_with_the_micro_batch(family: str, name: str) -> None:
    device = CATALOG.get(name)
    for cost in FAMILIES[family].blocks(None, "fp16"):
        times = [sum(block_seconds(cost, device, "fp16", m)) for m in (1, 2, 4, 8, 32, 128)]
        sizes = (1, 2, 4, 8, 32, 128)
        assert all(a < b for a, b in itertools.pairwise(times)), cost.name
        per_sample = [t / m for t, m in zip(times, sizes, strict=True)]
        assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(per_sample)), cost.name


def test_work_refuses_nonsense() -> None:
    with pytest.raises(HetplanError):
        Work(kind="conv")
    with pytest.raises(HetplanError):
        Work(kind="memory", flops=1.0)
    with pytest.raises(HetplanError):
        Work(kind="gemm", flops=1.0, tiles=0.0)
    with pytest.raises(HetplanError):
        work_seconds(memory_work(1.0, 1), -1, achieved(GPU, "fp32"))


# -- relative speeds, as published benchmarks order them -------------------------------------------


def test_fp16_gemm_heavy_layers_order_h100_a100_v100_t4() -> None:
    """MLPerf Training and NVIDIA's own numbers: H100 > A100 > V100 > T4 in mixed precision."""
    t = {name: step_seconds(name, "fp16") for name in ("H100-SXM", "A100-80GB", "V100-16GB", "T4")}
    assert t["H100-SXM"] < t["A100-80GB"] < t["V100-16GB"] < t["T4"]
    # A100 vs V100: NVIDIA reports 2-3x on BERT-class training in mixed precision
    assert 2.0 <= t["V100-16GB"] / t["A100-80GB"] <= 3.5


def test_rtx_3090_trains_fp16_at_about_v100_speed_and_beats_it_in_fp32() -> None:
    """Lambda's GPU benchmarks put the RTX 3090 within about a quarter of a V100 in mixed precision;
    in fp32 the 3090's doubled FP32 rate (35.6 vs 15.7 TFLOPS) makes it clearly faster."""
    fp16 = step_seconds("RTX-3090", "fp16") / step_seconds("V100-16GB", "fp16")
    fp32 = step_seconds("RTX-3090", "fp32") / step_seconds("V100-16GB", "fp32")
    assert 0.75 <= fp16 <= 1.25
    assert fp32 < 0.8


def test_consumer_and_power_capped_cards_reach_less_than_their_paper_ratio() -> None:
    """T4 (70 W) and TITAN RTX (280 W, full-rate FP32 accumulate) lose more of their tensor peak
    than V100 does: their fp16 speed relative to V100 is below their paper-peak ratio."""
    v100 = CATALOG.get("V100-16GB")
    for name in ("T4", "TITAN-RTX", "L4"):
        device = CATALOG.get(name)
        paper = device.peak_flops("fp16") / v100.peak_flops("fp16")
        speed = step_seconds("V100-16GB", "fp16") / step_seconds(name, "fp16")
        assert speed < paper, name
    # and TITAN RTX, 1.04x V100 on paper, is not faster than it in mixed precision
    assert step_seconds("TITAN-RTX", "fp16") >= step_seconds("V100-16GB", "fp16")


def test_a_device_speed_depends_on_the_mix() -> None:
    """RTX 3090 has V100's bandwidth and 77% of its achieved fp16 GEMM rate: on a memory-bound
    layer (long sequence, small hidden) it is closer to V100 than on a GEMM-bound one."""
    gemm_bound = step_seconds("RTX-3090", "fp16", hidden=4096, seq=512) / step_seconds(
        "V100-16GB", "fp16", hidden=4096, seq=512
    )
    memory_bound = step_seconds("RTX-3090", "fp16", hidden=512, seq=4096) / step_seconds(
        "V100-16GB", "fp16", hidden=512, seq=4096
    )
    assert memory_bound < gemm_bound


# -- the catalog's figures ---------------------------------------------------------------------------


def test_every_catalog_type_states_figures_in_range() -> None:
    for device in CATALOG:
        eff = device.efficiency
        assert eff is not None, device.name
        assert "fp32" in eff.gemm and all(0 < v <= 1 for v in eff.gemm.values()), device.name
        assert 0 < eff.attention <= 1 and 0 < eff.memory <= 1 and eff.sms >= 1, device.name
        assert 0 <= eff.launch_s < 1e-4, device.name
        for dtype in eff.gemm:
            assert dtype == "fp32" or dtype in device.peak, (device.name, dtype)


def test_data_centre_parts_reach_more_of_their_tensor_peak_than_volta_and_power_capped_ones() -> None:
    """Narayanan et al. 2021 (52% of A100 peak end to end) vs Shoeybi et al. 2019 (30% of V100)."""
    a100 = CATALOG.get("A100-80GB").efficiency.gemm["fp16"]
    for name in ("V100-16GB", "T4", "L4", "TITAN-RTX"):
        assert CATALOG.get(name).efficiency.gemm["fp16"] < a100, name


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"gemm": {"fp32": 1.5}, "attention": 0.5, "memory": 0.8, "launch": "5us", "sms": 80}, "gemm.fp32"),
        ({"gemm": {"fp16": 0.5}, "attention": 0.5, "memory": 0.8, "launch": "5us", "sms": 80}, "gemm.fp32"),
        ({"gemm": {"fp32": 0.8, "bf16": 0.5}, "attention": 0.5, "memory": 0.8, "launch": "5us", "sms": 80}, "bf16"),
        ({"gemm": {"fp32": 0.8}, "attention": 0.0, "memory": 0.8, "launch": "5us", "sms": 80}, "attention"),
        ({"gemm": {"fp32": 0.8}, "attention": 0.5, "memory": 0.8, "launch": "5us", "sms": 0}, "sms"),
        ({"gemm": {"fp32": 0.8}, "attention": 0.5, "memory": 0.8, "launch": "5us", "sms": 80, "x": 1}, "x"),
        ({"gemm": {"fp32": 0.8}, "attention": 0.5, "launch": "5us", "sms": 80}, "memory"),
    ],
)
def test_bad_efficiency_figures_name_the_field(spec: dict, field: str) -> None:
    data = {"memory": "16GiB", "memory_bandwidth": "900GB/s", "tflops": {"fp32": 15.7, "fp16": 125}, "efficiency": spec}
    with pytest.raises(HetplanError) as err:
        parse_device_spec("X", Fields(data, file="devices.yaml", path="devices.X"))
    assert field in (err.value.field or "")


def test_an_inline_spec_may_state_figures() -> None:
    spec = {"gemm": {"fp32": 0.9, "fp16": 0.6}, "attention": 0.4, "memory": 0.7, "launch": "3us", "sms": 40}
    data = {"memory": "16GiB", "memory_bandwidth": "900GB/s", "tflops": {"fp32": 15.7, "fp16": 125}, "efficiency": spec}
    device = parse_device_spec("X", Fields(data, file="c.yaml", path="x"))
    assert device.efficiency == AchievedEfficiency({"fp32": 0.9, "fp16": 0.6}, 0.4, 0.7, 3e-6, 40)
    assert achieved(device, "bf16").gemm_flops == pytest.approx(0.9 * 15.7e12)  # no bf16 peak: fp32

"""The roofline: the single-roof model of earlier profiles (efficiency curve, two roofs, launch
overhead), and carrying times across devices by the ratio of achieved-efficiency estimates."""

from __future__ import annotations

import itertools

import pytest

from hetplan.contracts import load_catalog
from hetplan.contracts.catalog import AchievedEfficiency, DeviceType
from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.errors import HetplanError
from hetplan.profile.analytic import FAMILIES, analytic_profile
from hetplan.profile.analytic.base import gemm_work, memory_work
from hetplan.profile.carry import block_works, carry_times
from hetplan.profile.efficiency import achieved
from hetplan.profile.roofline import (
    BACKWARD_FLOPS_FACTOR,
    Efficiency,
    compute_efficiency,
    estimate_fwd_bwd,
    estimate_seconds,
    scale_block_time,
    scale_time,
)

GiB = 2**30
A100 = DeviceType("A100", memory=80 * GiB, memory_bandwidth=2039e9, peak={"fp32": 19.5e12, "fp16": 312e12})
DOUBLE = DeviceType("A100x2", memory=80 * GiB, memory_bandwidth=2 * 2039e9, peak={"fp32": 39e12, "fp16": 624e12})
NO_LAUNCH = Efficiency(launch_s=0.0)


def test_efficiency_curve_is_monotone_bounded_and_half_at_work_half() -> None:
    e = Efficiency()
    values = [compute_efficiency(w, e) for w in (0, 1, 8, 64, 256, 1024, 8192, 1e6, 1e9)]
    assert values[0] == 0.0
    assert all(a < b for a, b in itertools.pairwise(values))
    assert all(v <= e.compute_max for v in values)
    assert values[-1] == pytest.approx(e.compute_max, rel=1e-6)
    assert compute_efficiency(e.work_half, e) == pytest.approx(e.compute_max / 2)


def test_default_constants_are_in_the_stated_ranges() -> None:
    e = Efficiency()
    assert 0.6 <= e.compute_max <= 0.7
    # "a GEMM with a few hundred rows runs at about half efficiency"
    assert 100 <= e.work_half <= 500
    assert 0.5 < e.memory <= 1.0
    assert 0 < e.launch_s < 1e-4
    assert e.to_dict()["backward_flops_factor"] == 2.0


def test_memory_bound_op_is_limited_by_bandwidth() -> None:
    e = Efficiency()
    nbytes = 4e9  # a 4 GB elementwise pass with a trivial amount of arithmetic
    t = estimate_seconds(1e6, nbytes, A100, "fp16", work_items=1e6, kernels=1, efficiency=e)
    assert t == pytest.approx(nbytes / (A100.memory_bandwidth * e.memory) + e.launch_s)
    # more FLOPs that stay under the memory roof do not change the time
    t2 = estimate_seconds(1e9, nbytes, A100, "fp16", work_items=1e6, kernels=1, efficiency=e)
    assert t2 == pytest.approx(t)


def test_compute_bound_op_follows_peak_and_efficiency() -> None:
    e = Efficiency()
    flops, work = 1e13, 4096
    t = estimate_seconds(flops, 1e6, A100, "fp16", work_items=work, kernels=3, efficiency=e)
    expected = flops / (312e12 * compute_efficiency(work, e)) + 3 * e.launch_s
    assert t == pytest.approx(expected)
    assert estimate_seconds(flops, 1e6, A100, "fp32", work_items=work, efficiency=e) > t


def test_launch_overhead_is_per_kernel() -> None:
    t0 = estimate_seconds(0.0, 0.0, A100, "fp32", work_items=0, kernels=0)
    t4 = estimate_seconds(0.0, 0.0, A100, "fp32", work_items=0, kernels=4)
    assert t0 == 0.0
    assert t4 == pytest.approx(4 * Efficiency().launch_s)


def test_backward_is_twice_forward_flops() -> None:
    fwd, bwd = estimate_fwd_bwd(1e12, 1e6, 2e6, A100, "fp16", work_items=2048, kernels=5)
    assert BACKWARD_FLOPS_FACTOR == 2.0
    assert bwd == pytest.approx(2 * fwd)


def test_scale_time_is_identity_on_the_same_device() -> None:
    assert scale_time(0.0123, 1e12, 1e8, A100, A100, "fp32", 512) == pytest.approx(0.0123)


def test_scale_time_halves_compute_bound_time_on_a_twice_faster_device() -> None:
    exact = scale_time(0.01, 1e13, 1e6, A100, DOUBLE, "fp16", 4096, efficiency=NO_LAUNCH)
    assert exact == pytest.approx(0.005)
    # with launch overhead the ratio is a little above one half, and the other way round doubles
    with_launch = scale_time(0.01, 1e13, 1e6, A100, DOUBLE, "fp16", 4096, kernels=2)
    assert 0.005 < with_launch < 0.00501
    assert scale_time(0.005, 1e13, 1e6, DOUBLE, A100, "fp16", 4096, efficiency=NO_LAUNCH) == pytest.approx(0.01)


def test_scale_time_follows_bandwidth_for_memory_bound_work() -> None:
    slow_mem = DeviceType("slow", memory=GiB, memory_bandwidth=A100.memory_bandwidth / 4, peak=A100.peak)
    assert scale_time(1.0, 1e3, 1e10, A100, slow_mem, "fp32", 1e6, efficiency=NO_LAUNCH) == pytest.approx(4.0)


def test_scale_time_to_another_dtype_uses_the_target_peak() -> None:
    t = scale_time(1.0, 1e13, 1e3, A100, A100, "fp32", 1e6, to_dtype="fp16", efficiency=NO_LAUNCH)
    assert t == pytest.approx(19.5 / 312)


@pytest.mark.parametrize(
    "call",
    [
        lambda: estimate_seconds(-1.0, 0.0, A100, "fp32", work_items=1),
        lambda: estimate_seconds(1.0, -1.0, A100, "fp32", work_items=1),
        lambda: estimate_seconds(1e9, 0.0, A100, "fp32", work_items=0),
        lambda: compute_efficiency(-1),
        lambda: scale_time(-1.0, 1.0, 1.0, A100, A100, "fp32", 1),
        lambda: scale_time(1.0, 1.0, 1.0, A100, A100, "int8", 1),
        lambda: Efficiency(compute_max=1.5),
        lambda: Efficiency(memory=0.0),
        lambda: Efficiency(launch_s=-1e-6),
    ],
)
def test_bad_input_is_a_hetplan_error(call) -> None:
    with pytest.raises(HetplanError):
        call()


# -- carrying a measured time by the ratio of achieved-efficiency estimates ----------------------------

CATALOG = load_catalog()
FIGS = AchievedEfficiency(gemm={"fp32": 0.8, "fp16": 0.6}, attention=0.5, memory=0.8, launch_s=0.0, sms=108)
GPU = DeviceType("GPU", 80 * GiB, 2000e9, {"fp32": 20e12, "fp16": 300e12}, efficiency=FIGS)
GPU_X2 = DeviceType("GPUx2", 80 * GiB, 4000e9, {"fp32": 40e12, "fp16": 600e12}, efficiency=FIGS)
FAST_MATH = DeviceType("fast-math", 80 * GiB, 2000e9, {"fp32": 40e12, "fp16": 600e12}, efficiency=FIGS)


def test_scale_block_time_is_identity_on_the_same_device() -> None:
    works = FAMILIES["gpt"].blocks(None, "fp16")[1].works()
    assert scale_block_time(0.0123, works, 4, GPU, GPU, "fp16") == pytest.approx(0.0123)


def test_scale_block_time_halves_on_a_device_twice_as_fast_in_every_respect() -> None:
    works = FAMILIES["gpt"].blocks(None, "fp16")[1].works()
    assert scale_block_time(0.01, works, 4, GPU, GPU_X2, "fp16") == pytest.approx(0.005)
    assert scale_block_time(0.005, works, 4, GPU_X2, GPU, "fp16", backward=True) == pytest.approx(0.01)


def test_scale_block_time_follows_the_mix_of_work() -> None:
    """Twice the FLOP/s but the same bandwidth: a GEMM-bound block halves, a memory-bound one stays."""
    gemm = (gemm_work(8192, 8192, 8192, 2),)
    memory = (memory_work(1e9, 0),)
    assert scale_block_time(1.0, gemm, 1, GPU, FAST_MATH, "fp16") == pytest.approx(0.5)
    assert scale_block_time(1.0, memory, 1, GPU, FAST_MATH, "fp16") == pytest.approx(1.0)
    both = gemm + memory
    assert 0.5 < scale_block_time(1.0, both, 1, GPU, FAST_MATH, "fp16") < 1.0


def test_scale_block_time_to_another_dtype_scales_bytes_and_uses_the_target_rate() -> None:
    gemm = (gemm_work(8192, 8192, 8192, 4),)
    expected = achieved(GPU, "fp32").gemm_flops / achieved(GPU, "fp16").gemm_flops
    assert scale_block_time(1.0, gemm, 1, GPU, GPU, "fp32", to_dtype="fp16") == pytest.approx(expected)
    memory = (memory_work(4e9, 0),)
    assert scale_block_time(1.0, memory, 1, GPU, GPU, "fp32", to_dtype="fp16") == pytest.approx(0.5)
    with pytest.raises(HetplanError):
        scale_block_time(1.0, memory, 1, GPU, GPU, "int8")
    with pytest.raises(HetplanError):
        scale_block_time(-1.0, memory, 1, GPU, GPU, "fp32")


def test_carrying_an_analytic_profile_reproduces_the_analytic_estimates() -> None:
    """The carried ratio and the analytic profiler use one model: A100 times carried to V100 and T4
    are the V100 and T4 estimates."""
    a100, v100, t4 = (CATALOG.get(n) for n in ("A100-80GB", "V100-16GB", "T4"))
    config = {"layers": 2, "hidden": 512, "heads": 8, "seq": 256}
    source = analytic_profile("gpt", config, devices=[a100], dtype="fp16")
    carried = carry_times(source, a100.name, [v100, t4], catalog=CATALOG)
    direct = analytic_profile("gpt", config, devices=[v100, t4], dtype="fp16")
    for got, want in zip(carried.blocks, direct.blocks, strict=True):
        for name in (v100.name, t4.name):
            for m, t in want.times[name].items():
                assert got.times[name][m].fwd == pytest.approx(t.fwd)
                assert got.times[name][m].bwd == pytest.approx(t.bwd)
                assert got.times[name][m].source == "estimated"
    assert "achieved-efficiency" in carried.source["carried"]["method"]


def _imported(kind: str, flops: float, config: dict) -> ModelProfile:
    block = Block("layer0", kind, 0, 0.0, 1e6, 1e6, flops, times={"V100-16GB": {1: Timing(0.01, 0.02, "imported")}})
    return ModelProfile(model={"name": "x", "config": config}, dtype="fp16", blocks=[block])


def test_an_imported_transformer_layer_is_carried_by_its_analytic_parts() -> None:
    s, h, a = 2048, 1024, 16
    config = {"hidden_size": h, "sequence_length": s, "heads": a}
    layer = _imported("transformer", 24.0 * s * h * h + 4.0 * s * s * h, config)
    kinds = [w.kind for w in block_works(layer)[0]]
    assert kinds.count("attention") == 2 and kinds.count("memory") == 3 and kinds.count("gemm") == 4
    # FLOPs that do not match the stated shape: the generic GEMM + memory split
    odd = _imported("transformer", 1e9, config)
    assert [w.kind for w in block_works(odd)[0]] == ["gemm", "memory"]


def test_a_block_without_flops_carries_by_bandwidth_if_a_lookup_else_by_gemm_rate() -> None:
    fast_memory = DeviceType("fast-memory", 80 * GiB, 4000e9, GPU.peak, efficiency=FIGS)
    lookup = _imported("embedding", 0.0, {})
    unknown = _imported("conv", 0.0, {})
    for profile, expected in ((lookup, 0.005), (unknown, 0.01)):
        works = block_works(profile)[0]
        assert scale_block_time(0.01, works, 1, GPU, fast_memory, "fp16") == pytest.approx(expected)

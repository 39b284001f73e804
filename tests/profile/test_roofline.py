"""The roofline: efficiency curve, the two roofs, launch overhead and carrying times across devices."""

from __future__ import annotations

import itertools

import pytest

from planner.contracts.catalog import DeviceType
from planner.errors import HetplanError
from planner.profile.roofline import (
    BACKWARD_FLOPS_FACTOR,
    Efficiency,
    compute_efficiency,
    estimate_fwd_bwd,
    estimate_seconds,
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

"""The cost model's per-call overhead and the overlap slowdown (docs/cost-model.md, "Overheads",
"Overlap"): each charged where it applies and nowhere else."""

from __future__ import annotations

import pytest
from builders import make_cluster, make_profile

from hetplan.calibrate.params import with_type_figures
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.simulate import simulate

A100 = "A100-80GB"


def _plan(pipelines: list[tuple[list[tuple[int, int, str]], list[int]]]) -> Plan:
    built = [
        Pipeline(sum(micro), tuple(micro), tuple(Stage(a, b, (d,), (1.0,)) for a, b, d in stages))
        for stages, micro in pipelines
    ]
    return Plan(global_batch=sum(p.batch for p in built), pipelines=built)


def _inputs(**figures: float):
    profile = make_profile(4, times={A100: (0.01, 0.02)}, params=25_000_000, output_bytes=1e6)
    cluster = make_cluster([("n0", [(A100, 4)])], intra="10GB/s")
    return profile, with_type_figures(cluster, {A100: figures}) if figures else cluster


def _last_backward(result, device: str) -> tuple[float, float]:
    spans = [(lo, hi) for row, kind, lo, hi, _ in result.timeline if row == device and kind == "B"]
    return max(spans)


def test_overhead_added_to_every_forward_and_backward_call() -> None:
    plan = _plan([([(0, 2, "n0/0"), (2, 4, "n0/1")], [1, 2, 1])])
    profile, plain = _inputs()
    _, charged = _inputs(micro_batch_s=3e-3)
    before, after = simulate(plan, profile, plain), simulate(plan, profile, charged)
    for device in ("n0/0", "n0/1"):  # 3 forwards and 3 backwards each: 6 calls of 3 ms
        assert after.devices[device].compute_s - before.devices[device].compute_s == pytest.approx(6 * 3e-3)
    assert after.iteration_s > before.iteration_s


def test_overlap_slows_the_backward_only_on_the_span_a_collective_runs_beside_it() -> None:
    # two pipelines cut differently: n0/1 holds blocks 0-3, shared with n0/2 (blocks 2-3, released
    # first, part-way through n0/1's last backward) and with n0/0 (blocks 0-1, at its end)
    plan = _plan([([(0, 2, "n0/0"), (2, 4, "n0/2")], [1]), ([(0, 4, "n0/1")], [1])])
    profile, plain = _inputs()
    _, slowed = _inputs(overlap_slowdown=1.5)
    before = simulate(plan, profile, plain, timeline=True)
    after = simulate(plan, profile, slowed, timeline=True)
    b_lo, b_hi = _last_backward(before, "n0/1")
    reduces = [(lo, hi) for row, kind, lo, hi, _ in before.timeline if row == "n0/1" and kind == "allreduce"]
    overlap = sum(max(0.0, min(hi, b_hi) - max(lo, b_lo)) for lo, hi in reduces)
    assert overlap > 0
    a_lo, a_hi = _last_backward(after, "n0/1")
    assert (a_hi - a_lo) - (b_hi - b_lo) == pytest.approx(0.5 * overlap)
    assert after.devices["n0/1"].compute_s - before.devices["n0/1"].compute_s == pytest.approx(0.5 * overlap)
    for device in ("n0/0", "n0/2"):  # their all-reduces start only once their backward has ended
        assert _last_backward(after, device) == _last_backward(before, device)


def test_no_slowdown_where_nothing_overlaps() -> None:
    plan = _plan([([(0, 4, "n0/0")], [2]), ([(0, 4, "n0/1")], [2])])  # one gradient group, issued at the end
    profile, plain = _inputs()
    _, slowed = _inputs(overlap_slowdown=1.5)
    assert simulate(plan, profile, slowed).iteration_s == simulate(plan, profile, plain).iteration_s

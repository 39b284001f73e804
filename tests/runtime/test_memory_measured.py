"""The memory walk of a compiled schedule against what the runtime really holds, on this CPU.

A small GPT is measured block by block (its saved activations, outputs, parameters), planned by
hand (1F1B and GPipe, with and without a replicated stage, pipelines cut differently), trained for
two steps by real gloo ranks, and each rank's peak of live tensor bytes (the torch profiler's
allocator records, planner/runtime/memtrack.py) must be within 10% of the walk's prediction.
"""

from __future__ import annotations

import pytest
from builders import make_cluster

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.runtime.launcher import launch_local
from hetplan.schedule.compile import compile_plan
from hetplan.simulate.memory import plan_memory

MODEL = {"family": "gpt", "config": {"layers": 2, "hidden": 128, "heads": 4, "seq": 64, "vocab": 512}}
TOLERANCE = 0.10


@pytest.fixture(scope="module")
def profile():
    from hetplan.profile.measure import measure_profile

    return measure_profile(MODEL, micro_batches=(1, 2, 4), warmup=1, repeat=1)


@pytest.fixture(scope="module")
def bf16_profile():
    from hetplan.profile.measure import measure_profile

    return measure_profile(MODEL, micro_batches=(1, 2, 4), warmup=1, repeat=1, dtype="bf16")


def _stage(start: int, end: int, *devices: str, shares: tuple[float, ...] | None = None) -> Stage:
    return Stage(start, end, devices, shares or tuple(1.0 / len(devices) for _ in devices))


PLANS = {
    "1f1b": Plan(8, [Pipeline(8, (2, 2, 2, 2), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))], optimizer="adam"),
    "gpipe": Plan(
        8,
        [Pipeline(8, (2, 2, 2, 2), (_stage(0, 2, "n0/0"), _stage(2, 4, "n0/1"), _stage(4, 6, "n0/2")))],
        schedule="gpipe",
        optimizer="adam",
    ),
    "1f1b-replicated": Plan(
        8,
        [Pipeline(8, (4, 4), (_stage(0, 2, "n0/0", "n0/1"), _stage(2, 6, "n0/2")))],
        optimizer="momentum",
    ),
    "gpipe-two-pipelines-cut-differently": Plan(
        8,
        [
            Pipeline(5, (1, 2, 2), (_stage(0, 2, "n0/0"), _stage(2, 6, "n0/1"))),
            Pipeline(3, (3,), (_stage(0, 4, "n0/2"), _stage(4, 6, "n0/3"))),
        ],
        schedule="gpipe",
        optimizer="sgd",
    ),
}


@pytest.mark.parametrize("name", list(PLANS))
def test_the_memory_walk_matches_the_measured_peak_of_every_rank(tmp_path, profile, name) -> None:
    _check(tmp_path, profile, PLANS[name], name)


def test_the_memory_walk_matches_a_bf16_run_with_fp32_master_weights(tmp_path, bf16_profile) -> None:
    plan = Plan(8, [Pipeline(8, (2, 2, 2, 2), (_stage(0, 3, "n0/0"), _stage(3, 6, "n0/1")))], optimizer="adam")
    plan.dtype = "bf16"
    _check(tmp_path, bf16_profile, plan, "bf16 1f1b")


def _check(tmp_path, profile, plan: Plan, name: str) -> None:
    cluster = make_cluster([("n0", [("cpu", 4)])])
    config = build_rank_config(plan, profile, cluster, seed=0, backend="gloo")
    write_yaml(config, tmp_path / "rank-config.yaml")
    records = launch_local(tmp_path / "rank-config.yaml", steps=2).records
    predicted = plan_memory(compile_plan(plan, len(profile.blocks)), profile, cluster, optimizer=plan.optimizer)
    measured = {r["device"]: r["peak_memory_bytes"] for r in records if r["peak_memory_bytes"] is not None}
    assert set(measured) == set(plan.all_devices())  # every rank measured its second step
    assert all(r["memory_measured"] == "cpu allocator profile" for r in records)
    for device, peak in measured.items():
        want = predicted[device].tensor_bytes
        assert abs(peak / want - 1.0) <= TOLERANCE, f"{name} {device}: measured {peak:.0f} predicted {want:.0f}"

"""The memory walk's sync-mode buffers (``simulate.memory.sync_buffers``, ``sync_roles``) on exact
inputs: who receives in Adasum's tree, what WSP keeps and leaves to its server, SDPipe's group.
tests/runtime/test_memory_terms.py checks the same terms against real gloo ranks."""

from __future__ import annotations

import pytest
from builders import make_cluster, make_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.schedule.compile import compile_plan
from hetplan.simulate.memory import ADASUM_DOT_CHUNK, AVERAGE_CHUNK, plan_memory, sync_roles

PARAMS = 1000  # per block, two blocks a stage: 2000 parameters, 8000 bytes in fp32
FLAT = 4.0 * 2 * PARAMS


def _plan(devices_per_pipeline: list[tuple[str, ...]], **kw) -> Plan:
    pipelines = [Pipeline(2, (2,), (Stage(0, 2, d, tuple(1.0 / len(d) for _ in d)),)) for d in devices_per_pipeline]
    return Plan(2 * len(pipelines), pipelines, **kw)


def _memory(plan: Plan, devices: int):
    profile = make_profile(2, params=PARAMS)
    cluster = make_cluster([("n0", [("cpu", devices)])])
    compiled = compile_plan(plan, 2)
    return compiled, plan_memory(compiled, profile, cluster, optimizer=plan.optimizer, plan=plan)


def test_the_runtime_chunks_are_the_ones_priced() -> None:
    from hetplan.runtime.sync.adasum import DOT_CHUNK
    from hetplan.runtime.sync.wave_sync import AVERAGE_CHUNK as RUNTIME_AVERAGE_CHUNK

    assert DOT_CHUNK == ADASUM_DOT_CHUNK and RUNTIME_AVERAGE_CHUNK == AVERAGE_CHUNK


@pytest.mark.parametrize(("n", "receivers"), [(2, {0}), (3, {0}), (4, {0, 2}), (5, {0, 2})])
def test_adasum_receivers_are_the_trees_left_nodes(n: int, receivers: set[int]) -> None:
    plan = _plan([(f"n0/{p}",) for p in range(n)], optimizer="sgd", sync="adasum")
    compiled, use = _memory(plan, n)
    roles = sync_roles(compiled, plan)
    assert {p for p in range(n) if roles[f"n0/{p}"].receives} == receivers
    dots = 12.0 * min(2 * PARAMS, ADASUM_DOT_CHUNK)
    for p in range(n):  # the bucket on every holder; a receive buffer and the dot chunk on a receiver
        want = FLAT + (FLAT + dots if p in receivers else 0.0)
        assert use[f"n0/{p}"].activations == pytest.approx(want)


def test_a_replicated_stages_leader_gathers_its_replicas() -> None:
    plan = _plan([("n0/0", "n0/1"), ("n0/2",)], optimizer="adam", sync="adasum")
    compiled, use = _memory(plan, 3)
    roles = sync_roles(compiled, plan)
    assert roles["n0/0"].gathers and roles["n0/0"].receives
    assert not roles["n0/1"].gathers and not roles["n0/1"].receives and not roles["n0/2"].receives
    # Adam on parameter changes: old weights, delta, and on the receiver its buffer and dot chunk
    dots = 12.0 * min(2 * PARAMS, ADASUM_DOT_CHUNK)
    assert use["n0/0"].activations == pytest.approx(3 * FLAT + dots - FLAT)  # fp32 gradients freed by then
    assert use["n0/2"].activations == pytest.approx(FLAT)


@pytest.mark.parametrize(("wave", "staleness", "kept", "opt"), [(1, 0, 0, 2), (2, 0, 1, 2), (1, 2, 2, 3), (3, 1, 3, 2)])
def test_wsp_keeps_its_wave_on_the_device_and_the_optimizer_on_the_server(
    wave: int, staleness: int, kept: int, opt: int
) -> None:
    plan = _plan(
        [("n0/0",), ("n0/1",)], optimizer="adam", sync="wsp", sync_options={"wave": wave, "staleness": staleness}
    )
    _, use = _memory(plan, 2)
    for u in use.values():
        assert u.optimizer == 0.0  # Adam's moments live on the parameter server
        assert u.sync_state == kept * FLAT
        assert u.activations == pytest.approx(opt * FLAT - FLAT)  # the two flat buffers; gradients freed


def test_wsp_under_bf16_keeps_the_fp32_master_on_the_device() -> None:
    plan = _plan([("n0/0",), ("n0/1",)], optimizer="adam", sync="wsp", dtype="bf16")
    profile = make_profile(2, params=PARAMS, dtype="bf16")
    cluster = make_cluster([("n0", [("cpu", 2)])])
    use = plan_memory(compile_plan(plan, 2), profile, cluster, optimizer="adam", plan=plan)
    assert use["n0/0"].optimizer == FLAT


@pytest.mark.parametrize(("pipelines", "group_size", "group"), [(2, 2, 2), (4, 3, 3), (2, 4, 2)])
def test_sdpipe_holds_one_copy_per_group_member(pipelines: int, group_size: int, group: int) -> None:
    devices = [(f"n0/{p}",) for p in range(pipelines)]
    plan = _plan(devices, optimizer="adam", sync="sdpipe", sync_options={"group_size": group_size})
    _, use = _memory(plan, pipelines)
    average = 16.0 * min(2 * PARAMS, AVERAGE_CHUNK)
    for u in use.values():
        assert u.optimizer == 8.0 * 2 * PARAMS
        assert u.activations == pytest.approx(group * FLAT + average - FLAT)

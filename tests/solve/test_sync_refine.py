"""Cuts and batch shares re-balanced under a sync mode's own simulator (hetplan.solve.sync_refine)."""

from __future__ import annotations

import pytest
from builders import make_cluster, make_profile

from hetplan.contracts.plan import SYNC_MODES, Pipeline, Plan, Stage
from hetplan.simulate import simulate
from hetplan.solve.compare import sync_mode_rows
from hetplan.solve.sync_refine import refine_for_sync

A100, V100 = "A100-80GB", "V100-16GB"
FAST, SLOW = (0.01, 0.02), (0.03, 0.06)  # per block and sample: the V100 3x slower


def _two_pipelines(sync: str, shares: tuple[int, int], **options) -> Plan:
    pipelines = [
        Pipeline(shares[0], (2,) * (shares[0] // 2), (Stage(0, 2, ("n0/0",), (1.0,)),)),
        Pipeline(shares[1], (2,) * (shares[1] // 2), (Stage(0, 2, ("n0/1",), (1.0,)),)),
    ]
    return Plan(sum(shares), pipelines, optimizer="sgd", sync=sync, sync_options=options)


def test_wsp_shares_follow_the_pipelines_speeds() -> None:
    """With no gradient group no pipeline waits for another's all-reduce: the shares that balance
    the two pipelines' own times are 3:1 for a 3x speed ratio."""
    profile = make_profile(2, times={A100: FAST, V100: SLOW}, params=1000)
    cluster = make_cluster([("n0", [(A100, 1), (V100, 1)])])
    plan = _two_pipelines("wsp", (4, 4), staleness=1, wave=1)
    start = simulate(plan, profile, cluster)
    refined, sim, moves = refine_for_sync(plan, start, profile, cluster)
    assert moves >= 1
    assert [p.batch for p in refined.pipelines] == [6, 2]
    assert all(sum(p.micro_batches) == p.batch for p in refined.pipelines)
    # the pipelines' own compute (2 blocks, per sample fwd+bwd) is now equal: 6 x 0.06 = 2 x 0.18
    assert sim.iteration_s < 0.75 * start.iteration_s
    assert sim.iteration_s == pytest.approx(simulate(refined, profile, cluster).iteration_s)


def test_cuts_move_to_the_slow_stage_under_the_mode() -> None:
    """One two-stage pipeline across an A100 and a V100, cut in the middle: the cut moves until
    the V100 holds one block of four."""
    per_block = {A100: [FAST] * 4, V100: [SLOW] * 4}
    profile = make_profile(4, per_block=per_block, params=1000)
    cluster = make_cluster([("n0", [(A100, 1), (V100, 1)])])
    stages = (Stage(0, 2, ("n0/0",), (1.0,)), Stage(2, 4, ("n0/1",), (1.0,)))
    plan = Plan(8, [Pipeline(8, (2, 2, 2, 2), stages)], optimizer="sgd", sync="adasum")
    start = simulate(plan, profile, cluster)
    refined, sim, _ = refine_for_sync(plan, start, profile, cluster)
    assert [(s.start, s.end) for s in refined.pipelines[0].stages] == [(0, 3), (3, 4)]
    assert sim.iteration_s < start.iteration_s


@pytest.mark.parametrize(
    ("sync", "options"),
    [("allreduce", {}), ("adasum", {}), ("topk", {"ratio": 0.1}), ("wsp", {"staleness": 1, "wave": 2}), ("sdpipe", {})],
)
def test_never_worse_and_deterministic(sync: str, options: dict) -> None:
    per_block = {A100: [FAST, FAST, (0.02, 0.04)], V100: [SLOW, SLOW, (0.06, 0.12)]}
    profile = make_profile(3, per_block=per_block, params=2_000_000)
    cluster = make_cluster([("n0", [(A100, 2)]), ("n1", [(V100, 2)])], inter="10Gbps")
    pipelines = [
        Pipeline(8, (2,) * 4, (Stage(0, 2, ("n0/0",), (1.0,)), Stage(2, 3, ("n1/0",), (1.0,)))),
        Pipeline(8, (2,) * 4, (Stage(0, 2, ("n0/1",), (1.0,)), Stage(2, 3, ("n1/1",), (1.0,)))),
    ]
    plan = Plan(16, pipelines, optimizer="sgd", sync=sync, sync_options=options)
    start = simulate(plan, profile, cluster)
    first = refine_for_sync(plan, start, profile, cluster)
    again = refine_for_sync(plan, start, profile, cluster)
    assert first[0].to_dict() == again[0].to_dict()
    assert first[1].iteration_s <= start.iteration_s
    assert first[0].global_batch == sum(p.batch for p in first[0].pipelines) == 16
    if sync == "sdpipe":  # its pipelines must stay equally shaped: a lone cut move cannot run
        cuts = {tuple((s.start, s.end) for s in p.stages) for p in first[0].pipelines}
        assert len(cuts) == 1


def test_a_zero_budget_keeps_the_plan() -> None:
    profile = make_profile(2, times={A100: FAST, V100: SLOW}, params=1000)
    cluster = make_cluster([("n0", [(A100, 1), (V100, 1)])])
    plan = _two_pipelines("wsp", (4, 4))
    start = simulate(plan, profile, cluster)
    kept, sim, moves = refine_for_sync(plan, start, profile, cluster, budget_tasks=0)
    assert moves == 0 and kept is plan and sim is start


def test_compare_puts_every_mode_beside_the_plans_own() -> None:
    """The plan's pipelines under each mode: top-k beats the all-reduce on a slow network, the plan's
    own row is the reference, and a mode that cannot run the plan says why."""
    profile = make_profile(2, times={A100: FAST}, params=50_000_000)
    cluster = make_cluster([("n0", [(A100, 1)]), ("n1", [(A100, 1)])], inter="10Gbps")
    pipelines = [
        Pipeline(4, (2, 2), (Stage(0, 2, ("n0/0",), (1.0,)),)),
        Pipeline(4, (2, 2), (Stage(0, 2, ("n1/0",), (1.0,)),)),
    ]
    rows = sync_mode_rows(Plan(8, pipelines, optimizer="sgd"), profile, cluster, options={"ratio": 0.05})
    by = {r["sync"]: r for r in rows}
    assert list(by) == list(SYNC_MODES)
    assert by["allreduce"]["own"] and by["allreduce"]["speedup"] == pytest.approx(1.0)
    assert by["topk"]["options"] == {"ratio": 0.05} and by["topk"]["speedup"] > 1.5
    assert by["wsp"]["options"] == {"staleness": 0, "wave": 1}
    for r in rows:
        assert r["samples_per_s"] == pytest.approx(8 / r["iteration_s"])
    zero = sync_mode_rows(Plan(8, pipelines, optimizer="sgd", zero=1), profile, cluster)
    refused = {r["sync"]: r["why"] for r in zero if r["iteration_s"] is None}
    assert set(refused) == {"wsp", "sdpipe", "adasum", "topk"} and all("zero" in w for w in refused.values())

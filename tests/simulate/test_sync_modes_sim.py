"""The simulator's sync modes against closed forms: Adasum and top-k all-gather, WSP's push and pull
through the central process, SDPipe's pipelines at their own paces."""

from __future__ import annotations

import math

import pytest
from builders import make_cluster, make_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.simulate import simulate
from hetplan.simulate.costs import CostModel

A100, V100 = "A100-80GB", "V100-16GB"
PARAMS = 50_000_000  # per block: gradients big enough that the sync dominates on a slow network


def _setup(times: dict[str, tuple[float, float]] | None = None):
    profile = make_profile(2, times=times or {A100: (0.01, 0.02)}, params=PARAMS)
    cluster = make_cluster([("n0", [(A100, 1)]), ("n1", [(A100, 1)])], inter="10Gbps")
    return profile, cluster


def _plan(sync: str, **options) -> Plan:
    pipelines = [
        Pipeline(4, (2, 2), (Stage(0, 2, ("n0/0",), (1.0,)),)),
        Pipeline(4, (2, 2), (Stage(0, 2, ("n1/0",), (1.0,)),)),
    ]
    return Plan(global_batch=8, pipelines=pipelines, optimizer="sgd", sync=sync, sync_options=options)


def _group_seconds(result) -> list[float]:
    return [hi - lo for _, kind, lo, hi, _ in result.timeline if kind == "allreduce"]


def test_adasum_and_topk_all_gather_the_contributions() -> None:
    profile, cluster = _setup()
    costs = CostModel(profile, cluster, optimizer="sgd")
    devices = [cluster.device("n0/0"), cluster.device("n1/0")]
    nbytes = costs.gradient_bytes((0, 1))
    adasum = simulate(_plan("adasum"), profile, cluster, timeline=True)
    assert _group_seconds(adasum)[0] == pytest.approx(costs.all_gather(2 * nbytes, devices))
    topk = simulate(_plan("topk", ratio=0.01), profile, cluster, timeline=True)
    k = math.ceil(0.01 * nbytes / 4)
    assert _group_seconds(topk)[0] == pytest.approx(costs.all_gather(2 * 12 * k, devices))
    plain = simulate(_plan("allreduce"), profile, cluster)
    # on a slow link: sparse < sum <= gather (two holders: the all-gather moves what the all-reduce does)
    assert topk.iteration_s < plain.iteration_s <= adasum.iteration_s


def test_wsp_pays_the_wave_push_and_pull_at_the_step() -> None:
    profile, cluster = _setup()
    plain = simulate(_plan("allreduce"), profile, cluster)
    for wave in (1, 2):
        wsp = simulate(_plan("wsp", staleness=1, wave=wave), profile, cluster)
        nbytes = 2 * CostModel(profile, cluster).gradient_bytes((0, 1))  # both devices, every block
        link = cluster.link("n1/0", "n0/0")
        exchange = 2.0 * (nbytes / link.bandwidth + link.latency) / wave
        compute = 2 * 2 * (0.01 + 0.02) * 2  # two blocks, two micro-batches of 2 samples (linear)
        assert wsp.iteration_s == pytest.approx(compute + exchange, rel=1e-6)
    assert not _group_seconds(simulate(_plan("wsp"), profile, cluster, timeline=True))
    assert plain.iteration_s > 0


def test_sdpipe_pipelines_run_at_their_own_pace() -> None:
    profile = make_profile(2, times={A100: (0.01, 0.02), V100: (0.03, 0.06)}, params=1000)
    cluster = make_cluster([("n0", [(A100, 1), (V100, 1)])])
    pipelines = [
        Pipeline(4, (2, 2), (Stage(0, 2, ("n0/0",), (1.0,)),)),
        Pipeline(4, (2, 2), (Stage(0, 2, ("n0/1",), (1.0,)),)),
    ]
    sd = simulate(Plan(8, pipelines, optimizer="sgd", sync="sdpipe"), profile, cluster)
    sync = simulate(Plan(8, pipelines, optimizer="sgd"), profile, cluster)
    t_fast, t_slow = 2 * 2 * 0.03 * 2, 2 * 2 * 0.09 * 2  # two blocks, two micro-batches of 2 samples
    # nearly the rate of each pipeline on its own (the weight swap and steps are tiny here)
    assert sd.iteration_s == pytest.approx(8 / (4 / t_fast + 4 / t_slow), rel=0.02)
    assert sd.iteration_s < 0.75 * sync.iteration_s

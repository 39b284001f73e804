"""Emulated slow links pace the central process's traffic (wsp's push and pull) and ZeRO-1's
reduce-scatter and all-gather, by the simulator's formulas; pacing sleeps, it changes no number.

Two pipelines of one device each, on nodes ``a`` and ``b`` joined by a slow emulated link: there are
no pipeline transfers, so whatever ``emulated_link_s`` records comes from the traffic under test.
"""

from __future__ import annotations

import pytest
from builders import zoo_profile

from hetplan.contracts.cluster import Link, parse_cluster
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.models import resolve_model
from hetplan.runtime.launcher import launch_local

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
BANDWIDTH, LATENCY = 2e6, 0.02
STEPS = 3
PIPELINES = [Pipeline(2, (2,), (Stage(0, 6, (f"{n}/0",), (1.0,)),)) for n in ("a", "b")]


def _cluster():
    return parse_cluster(
        {
            "schema": "hetplan/cluster/v1",
            "name": "t",
            "nodes": [
                # a node's own link, fast and not emulated: only the a-b network is slow
                {"name": n, "devices": [{"type": "cpu", "count": 1}], "link": {"bandwidth": "10GB/s"}}
                for n in ("a", "b")
            ],
            "network": {"bandwidth": "2MB/s", "latency": f"{LATENCY * 1000:g}ms", "emulate": True},
        },
        file="c.yaml",
    )


def _model_bytes() -> int:
    """fp32 bytes of the whole model (each device here holds all of it)."""
    zoo = resolve_model(GPT)
    return 4 * sum(p.numel() for b in zoo.build_blocks(0, len(zoo.block_names()), 1) for p in b.parameters())


def _run(tmp_path, plan: Plan, *, emulate: bool):
    config = build_rank_config(plan, zoo_profile(GPT), _cluster(), seed=1, backend="gloo", timeout_s=60)
    path = tmp_path / f"rank-config-{emulate}.yaml"
    write_yaml(config, path)
    result = launch_local(path, steps=STEPS, emulate=emulate)
    return {d: sorted((r for r in result.records if r["device"] == d), key=lambda r: r["step"]) for d in ("a/0", "b/0")}


def _losses(records) -> list[float]:
    return [r["loss"] for d in sorted(records) for r in records[d]]


def test_wsp_push_and_pull_are_paced_on_the_slow_path(tmp_path) -> None:
    plan = Plan(global_batch=4, pipelines=PIPELINES, optimizer="adam", sync="wsp", sync_options={"staleness": 0})
    paced = _run(tmp_path, plan, emulate=True)
    # the simulator's exchange: every device's gradient in and weights out over the slowest path
    floor = 2.0 * (2 * _model_bytes() / BANDWIDTH + LATENCY)
    assert floor > 0.05
    for r in paced["b/0"]:  # b/0 reaches the central process (on a) over the slow link
        assert r["emulated_link_s"] > 0
        assert r["iteration_s"] >= floor
    for r in paced["a/0"]:  # a/0 shares the central process's node: it crosses no emulated link
        assert r["emulated_link_s"] == 0
    plain = _run(tmp_path, plan, emulate=False)
    assert all("emulated_link_s" not in r for rs in plain.values() for r in rs)
    assert _losses(paced) == pytest.approx(_losses(plain), abs=1e-6)


def test_zero1_reduce_scatter_and_all_gather_are_paced(tmp_path) -> None:
    plan = Plan(global_batch=4, pipelines=PIPELINES, optimizer="adam", zero=1)
    paced = _run(tmp_path, plan, emulate=True)
    link = Link(bandwidth=BANDWIDTH, latency=LATENCY)
    # the reduce-scatter and the all-gather: half a ring all-reduce of the group's fp32 bytes each
    floor = link.ring_allreduce_time(_model_bytes(), 2)
    assert floor > 0.05
    for d in ("a/0", "b/0"):
        for r in paced[d]:
            assert r["emulated_link_s"] > 0
            assert r["iteration_s"] >= floor
    plain = _run(tmp_path, plan, emulate=False)
    assert _losses(paced) == pytest.approx(_losses(plain), abs=1e-6)


def test_sdpipe_weight_swap_is_paced(tmp_path) -> None:
    plan = Plan(global_batch=4, pipelines=PIPELINES, optimizer="adam", sync="sdpipe", sync_options={"group_size": 2})
    paced = _run(tmp_path, plan, emulate=True)
    # one swap partner a step, over the slow link: the weights' bytes plus a latency
    floor = Link(bandwidth=BANDWIDTH, latency=LATENCY).transfer_time(_model_bytes())
    for d in ("a/0", "b/0"):
        for r in paced[d]:
            assert r["group"] == [0, 1]
            assert r["emulated_link_s"] > 0
            assert r["iteration_s"] >= floor
    plain = _run(tmp_path, plan, emulate=False)
    assert _losses(paced) == pytest.approx(_losses(plain), abs=1e-6)

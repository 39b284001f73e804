"""Emulation that a local run can show: a link made slow (transfers last what their bytes need on
its stated bandwidth and latency) and a straggler from a step on, both labelled in the run log."""

from __future__ import annotations

import pytest
from builders import zoo_profile

from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.emulation import parse_straggler
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.errors import HetplanError
from hetplan.local_job import add_stragglers
from hetplan.runtime.launcher import launch_local

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
LATENCY = 0.05
PLAN = Plan(
    global_batch=4,
    pipelines=[Pipeline(4, (2, 2), (Stage(0, 3, ("a/0",), (1.0,)), Stage(3, 6, ("b/0",), (1.0,))))],
    optimizer="sgd",
)


def _cluster(emulate_link: bool):
    return parse_cluster(
        {
            "schema": "hetplan/cluster/v1",
            "name": "t",
            "nodes": [
                {"name": "a", "devices": [{"type": "cpu", "count": 1}]},
                {"name": "b", "devices": [{"type": "cpu", "count": 1}]},
            ],
            "network": {"bandwidth": "10MB/s", "latency": f"{LATENCY * 1000:g}ms", "emulate": emulate_link},
        },
        file="c.yaml",
    )


def _launch(tmp_path, config: dict, steps: int = 3):
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    return launch_local(path, steps=steps, emulate=True)


def test_a_slow_link_is_never_faster_than_stated(tmp_path) -> None:
    config = build_rank_config(PLAN, zoo_profile(GPT), _cluster(True), seed=1, backend="gloo", timeout_s=60)
    # (a node without a link of its own takes the network's, emulated too: only a-b carries transfers here)
    assert {"nodes": ["a", "b"], "bandwidth": 10e6, "latency": LATENCY} in config["emulated_links"]
    result = _launch(tmp_path, config)
    for r in result.records:
        assert "emulated_link_s" in r
        # each rank receives two batches a step (activations on b, gradients on a): a latency each at least
        assert r["wait_s"] >= 2 * LATENCY
    plain = build_rank_config(PLAN, zoo_profile(GPT), _cluster(False), seed=1, backend="gloo", timeout_s=60)
    assert "emulated_links" not in plain


def test_a_straggler_slows_its_device_from_its_step_on(tmp_path) -> None:
    config = build_rank_config(PLAN, zoo_profile(GPT), _cluster(False), seed=1, backend="gloo", timeout_s=60)
    add_stragglers(config, [parse_straggler("b/0:3x@2")], emulate=True)
    result = _launch(tmp_path, config, steps=4)
    slow = {r["step"]: r.get("emulated_slowdown") for r in result.records if r["device"] == "b/0"}
    assert slow == {0: None, 1: None, 2: 3.0, 3: 3.0}
    assert all("emulated_slowdown" not in r for r in result.records if r["device"] == "a/0")


@pytest.mark.parametrize(
    ("text", "emulate", "words"), [("c/0:2x@1", True, "not in the plan"), ("b/0:2x@1", False, "--emulate")]
)
def test_bad_stragglers_get_one_line(text: str, emulate: bool, words: str) -> None:
    config = build_rank_config(PLAN, zoo_profile(GPT), _cluster(False), seed=1, backend="gloo", timeout_s=60)
    with pytest.raises(HetplanError) as err:
        add_stragglers(config, [parse_straggler(text)], emulate=emulate)
    assert words in str(err.value) and "--straggler" in str(err.value)

"""The host-staged transport as a link class of its own: a node's ``host_staged`` copy (device to host
at the sender, host to device at the receiver) priced on every transfer and once per collective."""

from __future__ import annotations

import copy

import pytest
from builders import linear_plan, make_profile

from hetplan.contracts.cluster import parse_cluster
from hetplan.errors import HetplanError
from hetplan.simulate import simulate
from hetplan.simulate.costs import CostModel

A100 = "A100-80GB"
RAW = {
    "schema": "hetplan/cluster/v1",
    "name": "staged",
    "nodes": [
        {"name": "n0", "devices": [{"type": A100, "count": 2}], "link": {"bandwidth": "100GB/s", "latency": "5us"}},
        {"name": "n1", "devices": [{"type": A100, "count": 2}], "link": {"bandwidth": "100GB/s", "latency": "5us"}},
    ],
    "network": {"bandwidth": "10GB/s", "latency": "10us"},
}


def _cluster(staged: dict | None):
    raw = copy.deepcopy(RAW)
    if staged is not None:
        raw["nodes"][0]["host_staged"] = staged
    return parse_cluster(raw, file="c.yaml")


def test_a_transfer_touching_a_staged_node_adds_its_copies_in_series() -> None:
    direct, staged = _cluster(None), _cluster({"bandwidth": "25GB/s", "latency": "20us"})
    inside = staged.link("n0/0", "n0/1")  # both ends on the staged node: two copies
    assert inside.staged and not direct.link("n0/0", "n0/1").staged
    assert inside.bandwidth == pytest.approx(1 / (1 / 100e9 + 2 / 25e9))
    assert inside.latency == pytest.approx(5e-6 + 2 * 20e-6)
    across = staged.link("n0/0", "n1/0")  # one staged end: one copy
    assert across.bandwidth == pytest.approx(1 / (1 / 10e9 + 1 / 25e9)) and across.shared
    assert staged.link("n1/0", "n1/1") == direct.link("n1/0", "n1/1")  # the other node is untouched


def test_a_collective_on_a_staged_node_copies_once_each_way() -> None:
    profile = make_profile(2, times={A100: (0.01, 0.02)})
    nbytes = 1e9
    for devices in (["n0/0", "n0/1"], ["n0/0", "n1/0"]):
        direct, staged = _cluster(None), _cluster({"bandwidth": "25GB/s", "latency": "20us"})
        members = [direct.device(a) for a in devices]
        plain = CostModel(profile, direct).allreduce(nbytes, members)
        members = [staged.device(a) for a in devices]
        copies = 2 * (20e-6 + nbytes / 25e9)
        assert CostModel(profile, staged).allreduce(nbytes, members) == pytest.approx(plain + copies)


def test_a_pipeline_across_a_staged_node_is_slower_by_the_copies() -> None:
    profile = make_profile(2, times={A100: (0.01, 0.02)}, output_bytes=1e8)
    plan = linear_plan(["n0/0", "n0/1"], 2, [1, 1], optimizer="sgd")
    direct = simulate(plan, profile, _cluster(None)).iteration_s
    staged = simulate(plan, profile, _cluster({"bandwidth": "25GB/s"})).iteration_s
    # each transfer gains two copies of 1e8 bytes at 25 GB/s (8 ms); at least the first forward and
    # the last backward transfer are on the critical path (the others may overlap compute)
    extra = 2 * 1e8 / 25e9
    assert staged - direct >= 2 * extra - 1e-9


@pytest.mark.parametrize("value", [{"bandwidth": "fast"}, {"latency": "1us"}, {"bandwidth": "1GB/s", "nope": 1}])
def test_a_bad_host_staged_entry_is_one_located_line(value: dict) -> None:
    with pytest.raises(HetplanError) as err:
        _cluster(value)
    assert "host_staged" in str(err.value) and "\n" not in str(err.value)

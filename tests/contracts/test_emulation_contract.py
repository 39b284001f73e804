"""Emulation that changes during a run: stragglers from a step on, and links that are made slow."""

from __future__ import annotations

import pytest

from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.emulation import SlowdownSchedule, parse_straggler
from hetplan.errors import HetplanError


def _cluster(device: dict, link: dict | None = None) -> dict:
    return {
        "schema": "hetplan/cluster/v1",
        "name": "t",
        "nodes": [{"name": "local", "devices": [device], "link": link or {"bandwidth": "1GB/s"}}],
        "network": {"bandwidth": "1GB/s"},
    }


def test_a_schedule_changes_at_its_steps() -> None:
    schedule = SlowdownSchedule(base=1.5, changes=((3, 4.5), (6, 1.5)))
    assert [schedule.at(s) for s in range(8)] == [1.5, 1.5, 1.5, 4.5, 4.5, 4.5, 1.5, 1.5]
    assert schedule.with_change(3, 2.0).at(4) == 2.0 and schedule.with_change(1, 2.0).changes[0] == (1, 2.0)
    with pytest.raises(ValueError):
        SlowdownSchedule(changes=((5, 2.0), (2, 3.0)))


@pytest.mark.parametrize("text", ["local/1:3x@10", " n0/12:2.5x@0 "])
def test_straggler_flags_parse(text: str) -> None:
    s = parse_straggler(text)
    assert s.device.endswith(("/1", "/12")) and s.factor in (3.0, 2.5) and s.step in (10, 0)


@pytest.mark.parametrize("text", ["local/1:3@10", "local:3x@10", "local/1:0.5x@2", "local/1:3x"])
def test_bad_straggler_flags_get_one_line(text: str) -> None:
    with pytest.raises(HetplanError) as err:
        parse_straggler(text)
    assert "--straggler" in str(err.value) and "\n" not in str(err.value)


def test_emulated_types_carry_their_changes_relative_to_the_base() -> None:
    data = _cluster({"type": "slow", "count": 1, "emulate": {"base": "cpu", "slowdown": 2.0,
                                                             "changes": [{"step": 4, "slowdown": 3.0}]}})  # fmt: skip
    t = parse_cluster(data, file="c.yaml").device("local/0").type
    assert t.slowdown == 2.0 and t.slowdown_changes == ((4, 3.0),)


@pytest.mark.parametrize(
    ("changes", "field"),
    [([{"step": 4, "slowdown": 0.5}], "changes[0].slowdown"), ([{"step": 4, "slowdown": 2}, {"step": 2, "slowdown": 3}],
                                                                "changes[1].step")],
)  # fmt: skip
def test_bad_changes_get_one_line(changes: list, field: str) -> None:
    data = _cluster({"type": "slow", "count": 1, "emulate": {"base": "cpu", "slowdown": 1.0, "changes": changes}})
    with pytest.raises(HetplanError) as err:
        parse_cluster(data, file="c.yaml")
    assert field in str(err.value) and "c.yaml" in str(err.value)


def test_links_may_be_emulated() -> None:
    data = _cluster({"type": "cpu", "count": 2}, {"bandwidth": "100MB/s", "latency": "1ms", "emulate": True})
    cluster = parse_cluster(data, file="c.yaml")
    link = cluster.link("local/0", "local/1")
    assert link.emulated and link.bandwidth == 100e6 and link.latency == 1e-3
    data["nodes"][0]["link"]["emulate"] = "yes"
    with pytest.raises(HetplanError, match="emulate"):
        parse_cluster(data, file="c.yaml")

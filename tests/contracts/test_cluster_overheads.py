"""A cluster file's ``overheads: {TYPE: {micro_batch, overlap_slowdown}}`` (what ``hetplan calibrate``
writes) replaces the catalog's figures for every device of that type; bad entries are one line."""

from __future__ import annotations

import pytest

from hetplan.contracts.cluster import parse_cluster
from hetplan.errors import HetplanError


def _cluster(overheads) -> dict:
    return {
        "schema": "hetplan/cluster/v1",
        "name": "c",
        "nodes": [
            {"name": "a", "devices": [{"type": "A100-80GB", "count": 2}], "link": {"bandwidth": "300GB/s"}},
            {"name": "v", "devices": [{"type": "V100-16GB"}]},
        ],
        "network": {"bandwidth": "100Gbps"},
        "overheads": overheads,
    }


def test_overheads_apply_to_every_device_of_the_type_only() -> None:
    cluster = parse_cluster(_cluster({"A100-80GB": {"micro_batch": "40us", "overlap_slowdown": 1.2}}))
    types = {d.type.name: d.type for n in cluster.nodes for d in n.devices}
    assert types["A100-80GB"].micro_batch_s == pytest.approx(40e-6)
    assert types["A100-80GB"].overlap_slowdown == pytest.approx(1.2)
    assert types["V100-16GB"].micro_batch_s == 0.0 and types["V100-16GB"].overlap_slowdown == 1.0
    assert all(d.type is types["A100-80GB"] for d in cluster.nodes[0].devices)


def test_a_figure_left_out_keeps_the_catalogs() -> None:
    cluster = parse_cluster(_cluster({"V100-16GB": {"overlap_slowdown": 1.1}}))
    v100 = cluster.nodes[1].devices[0].type
    assert v100.overlap_slowdown == pytest.approx(1.1) and v100.micro_batch_s == 0.0


@pytest.mark.parametrize(
    ("overheads", "field"),
    [
        ({"T4": {"micro_batch": "1ms"}}, "overheads.T4"),
        ({"A100-80GB": {"overlap_slowdown": 0.5}}, "overheads.A100-80GB.overlap_slowdown"),
        ({"A100-80GB": {"micro_batch": "fast"}}, "overheads.A100-80GB.micro_batch"),
        ({"A100-80GB": 3}, "overheads.A100-80GB"),
        ({"A100-80GB": {"launch": "1us"}}, "overheads.A100-80GB"),
    ],
)
def test_bad_overheads_are_one_line_naming_the_field(overheads, field: str) -> None:
    with pytest.raises(HetplanError) as info:
        parse_cluster(_cluster(overheads), file="c.yaml")
    message = str(info.value)
    assert "\n" not in message and field in message, message

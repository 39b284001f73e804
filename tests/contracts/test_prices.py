"""Prices: per GPU-hour in the catalog (with source and date), per node in a cluster file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from builders import run_cli

from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.cluster import parse_cluster


def _catalog(tmp_path: Path, price: object) -> Path:
    data = {
        "schema": "hetplan/devices/v1",
        "devices": {"G": {"memory": "16GiB", "memory_bandwidth": "900GB/s", "tflops": {"fp32": 10}, "price": price}},
    }
    path = tmp_path / "devices.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _cluster(nodes: list[dict]) -> dict:
    return {"schema": "hetplan/cluster/v1", "name": "c", "nodes": nodes, "network": {"bandwidth": "100Gbps"}}


def test_catalog_price_is_read_with_source_and_date(tmp_path: Path) -> None:
    path = _catalog(tmp_path, {"per_hour": 1.25, "source": "a list price", "date": "2024-05"})
    price = load_catalog(path).get("G").price
    assert (price.per_hour, price.source, price.date) == (1.25, "a list price", "2024-05")


def test_bundled_prices_are_the_published_ones() -> None:
    catalog = load_catalog()
    assert catalog.get("A100-40GB").price.per_hour == 3.74
    assert catalog.get("V100-16GB").price.per_hour == 2.80
    assert catalog.get("T4").price is None


def test_node_price_overrides_catalog_and_unknown_is_none() -> None:
    a100 = {"name": "a", "devices": [{"type": "A100-40GB", "count": 2}], "link": {"bandwidth": "600GB/s"}}
    owned = dict(a100, name="b", price_per_hour=0)
    t4 = {"name": "t", "devices": [{"type": "T4"}]}
    cluster = parse_cluster(_cluster([a100, owned]))
    assert cluster.node_price("a") == pytest.approx(7.48)
    assert cluster.node_price("b") == 0.0
    assert cluster.price_per_hour == pytest.approx(7.48)
    assert parse_cluster(_cluster([a100, t4])).price_per_hour is None
    assert parse_cluster(_cluster([a100, dict(t4, price_per_hour=0.5)])).price_per_hour == pytest.approx(7.98)


@pytest.mark.parametrize(
    ("price", "field", "expect"),
    [
        ({"per_hour": -1, "source": "s", "date": "2024"}, "price.per_hour", "expected a number >= 0"),
        ({"per_hour": "3$", "source": "s", "date": "2024"}, "price.per_hour", "expected a number"),
        ({"per_hour": 1e6, "source": "s", "date": "2024"}, "price.per_hour", "expected a number <= 10000"),
        ({"per_hour": 1, "date": "2024"}, "price.source", "missing required field"),
        ({"per_hour": 1, "source": "s", "date": "May 2024"}, "price.date", "expected a date"),
        ({"per_hour": 1, "source": "s", "date": "2024", "currency": "EUR"}, "price.currency", "unknown field"),
        (3.74, "price", "expected a mapping"),
    ],
)
def test_bad_catalog_price_is_one_line(tmp_path: Path, capsys, price: object, field: str, expect: str) -> None:
    path = _catalog(tmp_path, price)
    code, _, err = run_cli(["validate", str(path)], capsys)
    assert code == 2
    assert err.strip().count("\n") == 0
    assert err.startswith(f"error: {path}: devices.G.{field}: ")
    assert expect in err


@pytest.mark.parametrize(("value", "expect"), [(-2, "expected a number >= 0"), ("free", "expected a number")])
def test_bad_node_price_is_one_line(tmp_path: Path, capsys, value: object, expect: str) -> None:
    path = tmp_path / "c.yaml"
    node = {"name": "a", "devices": [{"type": "T4"}], "price_per_hour": value}
    path.write_text(yaml.safe_dump(_cluster([node])))
    code, _, err = run_cli(["validate", str(path)], capsys)
    assert code == 2
    assert err.strip().count("\n") == 0
    assert err.startswith(f"error: {path}: nodes[0].price_per_hour: {expect}")

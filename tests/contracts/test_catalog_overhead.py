"""A catalog entry's ``overhead:`` (per-call seconds, overlap slowdown): parsed, defaulted, checked."""

from __future__ import annotations

import pytest

from hetplan.contracts.catalog import load_catalog, parse_device_spec
from hetplan.contracts.fields import Fields
from hetplan.errors import HetplanError

SPEC = {"memory": "16GiB", "memory_bandwidth": "900GB/s", "tflops": {"fp32": 15.7}, "vendor": "NVIDIA"}


def _parse(**extra: object):
    return parse_device_spec("X", Fields({**SPEC, **extra}, file="devices.yaml"))


def test_stated_overhead_and_slowdown_are_read() -> None:
    t = _parse(overhead={"micro_batch": "50us", "overlap_slowdown": 1.15, "source": "engineering estimate"})
    assert t.micro_batch_s == pytest.approx(50e-6)
    assert t.overlap_slowdown == 1.15


def test_without_overhead_the_cost_model_is_as_before() -> None:
    assert (_parse().micro_batch_s, _parse().overlap_slowdown) == (0.0, 1.0)
    for device_type in load_catalog():  # no bundled entry states one yet: bundled plans unchanged
        assert (device_type.micro_batch_s, device_type.overlap_slowdown) == (0.0, 1.0)


def test_a_slowdown_below_one_is_a_located_error() -> None:
    with pytest.raises(HetplanError) as exc:
        _parse(overhead={"overlap_slowdown": 0.9})
    assert "overhead.overlap_slowdown" in str(exc.value) and ">= 1" in str(exc.value)

"""The model profile's optional tensor-parallel and selective-recomputation keys: round trip,
accessors, and one-line errors naming the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hetplan.contracts import load_catalog
from hetplan.contracts.model_profile import parse_profile
from hetplan.errors import HetplanError

A100 = "A100-80GB"


def _data() -> dict[str, Any]:
    """Two blocks: block 0 whole only, block 1 with degrees 2 and 4 and selective data."""
    return {
        "schema": "hetplan/model-profile/v1",
        "model": {"name": "tp-test"},
        "dtype": "fp16",
        "blocks": [
            {
                "name": "embed",
                "params": 100,
                "activation_bytes": 10.0,
                "output_bytes": 8.0,
                "time": {A100: {1: {"fwd": 1.0, "bwd": 2.0}}},
            },
            {
                "name": "layer",
                "params": 1000,
                "activation_bytes": 400.0,
                "selective_bytes": 300.0,
                "output_bytes": 8.0,
                "time": {A100: {1: {"fwd": 4.0, "bwd": 8.0, "recompute": 3.0}, 4: {"fwd": 12.0, "bwd": 24.0}}},
                "tensor_parallel": {
                    2: {
                        "params": 520,
                        "param_bytes": 1040.0,
                        "activation_bytes": 220.0,
                        "selective_bytes": 150.0,
                        "allreduce_bytes": 8.0,
                        "time": {A100: {1: {"fwd": 2.5, "bwd": 5.0, "recompute": 1.5}}},
                    },
                    4: {
                        "params": 270,
                        "param_bytes": 540.0,
                        "activation_bytes": 130.0,
                        "allreduce_bytes": 8.0,
                        "allreduce_in_time": True,
                        "time": {"V100-16GB": {1: {"fwd": 9.0, "bwd": 18.0}}},
                    },
                },
            },
        ],
    }


def test_round_trip_keeps_every_new_key() -> None:
    profile = parse_profile(_data(), file="p.yaml")
    again = parse_profile(profile.to_dict(), file="p2.yaml")
    assert again.to_dict() == profile.to_dict()
    layer = again.blocks[1]
    assert layer.selective_bytes == 300.0 and layer.times[A100][1].recompute == 3.0
    assert layer.tensor_parallel[2].params == 520 and layer.tensor_parallel[2].selective_bytes == 150.0
    assert layer.tensor_parallel[4].allreduce_in_time and not layer.tensor_parallel[2].allreduce_in_time
    # a profile without the keys writes none of them (files made before stay byte-identical)
    plain = copy.deepcopy(_data())
    del plain["blocks"][1]["tensor_parallel"], plain["blocks"][1]["selective_bytes"]
    del plain["blocks"][1]["time"][A100][1]["recompute"]
    text = str(parse_profile(plain).to_dict())
    assert "tensor_parallel" not in text and "selective" not in text and "recompute" not in text


def test_degrees_times_shards_and_recompute() -> None:
    profile = parse_profile(_data())
    catalog = load_catalog()
    a100, v100 = catalog.get(A100), catalog.get("V100-16GB")
    assert profile.tp_degrees(0) == (1,)
    assert profile.tp_degrees(1) == (1, 2, 4)
    assert profile.tp_degrees(1, a100) == (1, 2)  # degree 4 was measured on V100s only
    assert profile.tp_degrees(1, v100) == (1, 4)
    assert profile.block_time(1, a100, 1) == (4.0, 8.0)
    assert profile.block_time(1, a100, 2, tp=2) == (5.0, 10.0)  # linear above the largest size, as degree 1
    assert profile.block_time(1, a100, 2) == (pytest.approx(20.0 / 3), pytest.approx(40.0 / 3))  # interpolated
    assert profile.recompute_time(1, a100, 1, tp=2) == 1.5
    assert profile.recompute_time(1, a100, 2.5) == pytest.approx(3.0 + 1.5 / 3 * (12.0 - 3.0))  # no point: fwd
    assert profile.recompute_time(0, a100, 1) == 0.0  # drops nothing, costs nothing
    shard = profile.shard(1, 4)
    assert (shard.params, shard.activation_bytes, shard.selective_bytes, shard.allreduce_in_time) == (
        270,
        130.0,
        0.0,
        True,
    )
    assert profile.shard(1).allreduce_bytes == 0.0 and profile.shard(1).params == 1000
    with pytest.raises(HetplanError, match="no tensor-parallel degree 2") as err:
        profile.block_time(0, a100, 1, tp=2)
    assert err.value.field == "blocks[0].tensor_parallel"
    with pytest.raises(HetplanError, match="no times for A100-80GB at tensor-parallel degree 4") as err:
        profile.block_time(1, a100, 1, tp=4)
    assert "V100-16GB" in str(err.value) and "\n" not in str(err.value)


def _set(data: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    data = copy.deepcopy(data)
    node = data
    for key in path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


_DELETE = object()
_TP = ["blocks", 1, "tensor_parallel"]


@pytest.mark.parametrize(
    ("path", "value", "field", "words"),
    [
        ([*_TP, 1], {}, "blocks[1].tensor_parallel", "degrees must be integers >= 2"),
        ([*_TP, "two"], {}, "blocks[1].tensor_parallel", "degrees must be integers >= 2"),
        ([*_TP], [1, 2], "blocks[1].tensor_parallel", "expected a mapping"),
        ([*_TP, 2, "params"], 2000, "blocks[1].tensor_parallel.2.params", "cannot hold more"),
        ([*_TP, 2, "params"], _DELETE, "blocks[1].tensor_parallel.2.params", "missing required field"),
        ([*_TP, 2, "allreduce_bytes"], -1, "blocks[1].tensor_parallel.2.allreduce_bytes", "expected a number >= 0"),
        ([*_TP, 2, "selective_bytes"], 999.0, "blocks[1].tensor_parallel.2.selective_bytes", "cannot drop"),
        ([*_TP, 2, "allreduce_in_time"], "yes", "blocks[1].tensor_parallel.2.allreduce_in_time", "true or false"),
        ([*_TP, 2, "time"], {}, "blocks[1].tensor_parallel.2.time", "at least one device type"),
        ([*_TP, 2, "tim"], {}, "blocks[1].tensor_parallel.2.tim", "unknown field"),
        ([*_TP, 2, "time", A100, 1, "recompute"], -0.5, "recompute", "expected a number >= 0"),
        (["blocks", 1, "selective_bytes"], 500.0, "blocks[1].selective_bytes", "cannot drop"),
        (["blocks", 1, "time", A100, 1, "recompute"], "fast", "blocks[1].time", "expected a number"),
    ],
)
def test_bad_tensor_parallel_data_is_one_located_line(path: list[Any], value: Any, field: str, words: str) -> None:
    with pytest.raises(HetplanError) as err:
        parse_profile(_set(_data(), path, value), file="bad.yaml")
    message = str(err.value)
    assert words in message and "\n" not in message
    assert err.value.file == "bad.yaml" and field in (err.value.field or "")

"""The plan's sync mode and its options: each mode takes only its own, checked, defaults filled in;
modes not yet built end to end are refused with one line where a plan is compiled."""

from __future__ import annotations

import pytest

from hetplan.contracts.plan import SYNC_OPTIONS, parse_plan
from hetplan.errors import HetplanError
from hetplan.schedule.compile import BUILT_SYNC_MODES, compile_plan


def _plan(sync: str, options: dict | None = None):
    data = {
        "schema": "hetplan/plan/v1",
        "inputs": {"profile": {"path": "p.yaml"}, "cluster": {"path": "c.yaml"}},
        "global_batch": 4,
        "sync": sync,
        "pipelines": [{"batch": 4, "micro_batches": [2, 2], "stages": [{"blocks": [0, 2], "devices": ["n/0"]}]}],
    }
    if options is not None:
        data["sync_options"] = options
    return parse_plan(data, file="plan.yaml")


@pytest.mark.parametrize("sync", list(SYNC_OPTIONS))
def test_defaults_fill_in_and_round_trip(sync: str) -> None:
    plan = _plan(sync)
    assert plan.sync_options == SYNC_OPTIONS[sync]
    assert all(plan.sync_option(k) == v for k, v in SYNC_OPTIONS[sync].items())
    assert parse_plan(plan.to_dict(), file="again.yaml").sync_options == plan.sync_options


@pytest.mark.parametrize(
    ("sync", "options", "field", "words"),
    [
        ("wsp", {"staleness": -1}, "sync_options.staleness", ">= 0"),
        ("wsp", {"wave": 0}, "sync_options.wave", ">= 1"),
        ("topk", {"ratio": 1.5}, "sync_options.ratio", "1"),
        ("sdpipe", {"group_size": 1}, "sync_options.group_size", "2"),
        ("allreduce", {"ratio": 0.1}, "sync_options.ratio", "no options"),
        ("adasum", {"staleness": 1}, "sync_options.staleness", "adasum takes"),
    ],
)
def test_bad_options_get_one_line(sync: str, options: dict, field: str, words: str) -> None:
    with pytest.raises(HetplanError) as err:
        _plan(sync, options)
    text = str(err.value)
    assert field in text and words in text and "plan.yaml" in text and "\n" not in text


@pytest.mark.parametrize("sync", [m for m in SYNC_OPTIONS if m not in BUILT_SYNC_MODES])
def test_modes_not_built_are_refused_where_a_plan_is_compiled(sync: str) -> None:
    with pytest.raises(HetplanError, match="not yet built"):
        compile_plan(_plan(sync), 2)

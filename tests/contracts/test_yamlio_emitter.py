"""``dump_yaml`` writes with libyaml's emitter where it may (issue 24: a 512-device plan's YAML was a
tenth of planning time): the bytes must be those of the Python emitter, on real plans and on
seeded random data full of strings YAML must quote."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
import yaml
from builders import make_cluster, make_profile

from hetplan.contracts import yamlio
from hetplan.solve import PlanOptions, plan_training
from hetplan.solve.search import plan_details

pytestmark = pytest.mark.skipif(getattr(yaml, "CSafeDumper", None) is None, reason="PyYAML built without libyaml")

ATOMS: list[Any] = [
    "8.6e9", "1e-5", "µs ünïcode", "a: b", "- x", "line1\nline2", "x" * 150, "", None, True, False, "yes", "no",
    "null", "~", float("nan"), float("inf"), -0.0, 1e-7, 5e-06, 12.5, 3, -4, "'quoted'", '"dq"', "#hash",
    "tab\there", "@at", "`bt", "[a]", "{b}", "%p", "* star", "!bang", "&amp", "0x1F", "012", "1_000",
    "2023-01-01", "\u2028sep", "trailing ", " leading", "é" * 60, "bell\x07", "nel\x85",
]  # fmt: skip


def _python(data: dict[str, Any]) -> str:
    return yaml.dump(
        data, Dumper=yamlio._Dumper, sort_keys=False, default_flow_style=None, width=100, allow_unicode=True
    )


def _random(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.4:
        return rng.choice(ATOMS)
    if r < 0.7:
        return [_random(rng, depth + 1) for _ in range(rng.randint(0, 6))]
    if r < 0.8:
        return tuple(_random(rng, depth + 1) for _ in range(rng.randint(0, 4)))
    return {f"{rng.choice(ATOMS)}{i}": _random(rng, depth + 1) for i in range(rng.randint(0, 5))}


def test_random_data_dumps_to_the_python_emitters_bytes() -> None:
    rng = random.Random(24)
    escaped = 0
    for _ in range(1500):
        data = {"k": _random(rng)}
        escaped += not yamlio._libyaml_safe(data)
        assert yamlio.dump_yaml(data) == _python(data)
    assert 100 < escaped < 1400  # both emitters were exercised


def test_a_plan_file_is_the_same_bytes() -> None:
    profile = make_profile(6, per_block={"A100-80GB": [(1.0, 2.0)] * 6, "T4": [(4.0, 8.0)] * 6}, params=10**6)
    cluster = make_cluster([("n0", [("A100-80GB", 2)]), ("n1", [("T4", 1)])], inter="10GB/s")
    result = plan_training(profile, cluster, PlanOptions(global_batch=8, optimizer="sgd"))
    plan = replace(result.plan, predicted=result.sim.predicted(), details=plan_details(result, cluster))
    data = plan.to_dict()
    assert data["details"]["structure"] and data["predicted"]["iteration_s"] > 0
    assert yamlio._libyaml_safe(data)
    assert yamlio.dump_yaml(data) == _python(data)

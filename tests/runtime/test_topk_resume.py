"""Top-k resumed through ``hetplan launch``'s own path: a run saved at step k and resumed goes on with
the losses of an uninterrupted one, because every device saves and reloads its error-feedback
residual (``worker.py`` through ``checkpoint.residual_state`` / ``load_residuals``). A residual lost
on resume changes what the next steps send, and the losses with it."""

from __future__ import annotations

import pytest
from builders import make_cluster, zoo_profile

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.contracts.yamlio import write_yaml
from hetplan.emit import build_rank_config
from hetplan.runtime.launcher import launch_local

GPT = {"family": "gpt", "config": {"layers": 2, "hidden": 32, "heads": 2, "seq": 8, "vocab": 31}}
PIPELINES = [
    Pipeline(5, (2, 3), (Stage(0, 6, ("n0/0",), (1.0,)),)),
    Pipeline(3, (3,), (Stage(0, 6, ("n0/1",), (1.0,)),)),
]


def _losses(result) -> dict[tuple[int, str], float]:
    return {(r["step"], r["device"]): r["loss"] for r in result.records}


def test_topk_resumed_continues_as_uninterrupted(tmp_path) -> None:
    plan = Plan(global_batch=8, pipelines=PIPELINES, optimizer="sgd", sync="topk", sync_options={"ratio": 0.05})
    config = build_rank_config(plan, zoo_profile(GPT), make_cluster([("n0", [("cpu", 2)])]), seed=3, backend="gloo")
    path = tmp_path / "rank-config.yaml"
    write_yaml(config, path)
    whole = _losses(launch_local(path, steps=5))
    first = _losses(launch_local(path, steps=2, save=tmp_path / "ckpt"))
    rest = _losses(launch_local(path, steps=3, resume=tmp_path / "ckpt"))
    assert sorted({**first, **rest}) == sorted(whole)
    for key, loss in {**first, **rest}.items():
        assert loss == pytest.approx(whole[key], abs=1e-6), key
    assert whole[(4, "n0/0")] != pytest.approx(whole[(0, "n0/0")], abs=1e-4)  # it trains

"""An sdpipe plan can be written: its simulated iteration was a numpy scalar, which reached the
plan file and made ``hetplan plan --sync sdpipe`` end in "internal error: RepresenterError"."""

from __future__ import annotations

from dataclasses import replace

from builders import make_cluster, make_profile

from hetplan.contracts.yamlio import dump_yaml
from hetplan.solve import PlanOptions, plan_training
from hetplan.solve.search import plan_details


def test_an_sdpipe_plan_has_python_floats_and_dumps() -> None:
    profile = make_profile(4, per_block={"A100-80GB": [(1.0, 2.0)] * 4, "T4": [(4.0, 8.0)] * 4}, params=10**6)
    cluster = make_cluster([("n0", [("A100-80GB", 2)]), ("n1", [("T4", 1)])], inter="10GB/s")
    result = plan_training(profile, cluster, PlanOptions(global_batch=8, optimizer="sgd", sync="sdpipe"))
    assert result.plan.sync == "sdpipe"
    assert type(result.sim.iteration_s) is float
    plan = replace(result.plan, predicted=result.sim.predicted(), details=plan_details(result, cluster))
    text = dump_yaml(plan.to_dict())
    assert "sync: sdpipe" in text

"""Planning-speed changes of issue 24 that must not change a plan: the lower bound's LP solved in the
second process (scipy stays out of the planning one), the Megatron-style family scored where a core
is free, its settings built from shared stages, and the per-stage checks and costs looked up once.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest
from builders import make_cluster, make_profile
from test_baseline_scoring import _tp_instance

from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.errors import HetplanError
from hetplan.simulate.simulator import simulate
from hetplan.solve import PlanOptions
from hetplan.solve.background import Deferred
from hetplan.solve.baselines import (
    _megatron_layout,
    _uniform_families,
    baseline_plans,
    equal_shares,
    fastest_uniform_tp_pp,
)
from hetplan.solve.batching import micro_batch_list
from hetplan.solve.tables import CostTables

ROOT = Path(__file__).resolve().parents[2]


def _square(x: int) -> int:
    return x * x


def test_a_deferred_call_is_ready_once_its_child_has_answered() -> None:
    assert Deferred(_square, 3, background=False).ready()  # no child: result() runs it here
    later = Deferred(_square, 7, background=True)
    deadline = time.monotonic() + 60
    while not later.ready() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert later.ready()
    assert later.result() == 49


_LARGE = """
import sys
sys.path.insert(0, {tests!r})
from builders import make_cluster, make_profile
from hetplan.solve import PlanOptions
from hetplan.solve.search import lower_bound
from hetplan.solve.training import plan_training

profile = make_profile(4, times={{"A100-80GB": (1.0, 2.0), "V100-16GB": (2.5, 5.0)}}, params=1000)
nodes = [(f"n{{i}}", [("A100-80GB" if i < 2 else "V100-16GB", 8)]) for i in range(8)]
cluster = make_cluster(nodes)
opts = PlanOptions(global_batch=64, micro_batch_sizes=(1, 2), max_stages=2)
result = plan_training(profile, cluster, opts)
print("scipy.optimize" in sys.modules)
print(result.lower_bound_s == lower_bound(profile, cluster, opts) > 0)
"""


def test_planning_on_a_large_cluster_leaves_scipy_to_the_second_process() -> None:
    """The LP bound is the planning path's only use of scipy (half a second to import): on a cluster
    large enough for a second process it is solved there, and gives the bound solved here."""
    script = _LARGE.format(tests=str(ROOT / "tests"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    imported, same = out.stdout.split()
    assert same == "True"
    from hetplan.solve.background import spare_core

    if spare_core():  # one core: everything runs here, scipy too
        assert imported == "False"


def test_the_megatron_family_scored_here_first_gives_the_same_baselines() -> None:
    profile, cluster = _tp_instance()
    opts = PlanOptions(global_batch=16, max_stages=8)
    usual = baseline_plans(profile, cluster, opts, None, background=False)
    first = fastest_uniform_tp_pp(profile, cluster, opts, None)
    given = baseline_plans(profile, cluster, opts, None, background=False, megatron=first)
    assert list(usual) == list(given)
    for name in usual:
        a, b = usual[name], given[name]
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.plan == b.plan and a.sim.iteration_s == b.sim.iteration_s, name


def _plain_uniform_plan(layout, n: int, opts: PlanOptions, tp: int, m: int, recompute: str, zero: int) -> Plan:
    """A Megatron-style plan built from scratch, every object its own (what the shared builder replaced)."""
    pp = len(layout[0])
    cuts = [round(i * n / pp) for i in range(pp + 1)]
    pipes = [
        Pipeline(
            b,
            micro_batch_list(b, min(m, b)),
            tuple(
                Stage(cuts[i], cuts[i + 1], tuple(group), (1.0,), tensor_parallel=tp, recompute=recompute)
                for i, group in enumerate(stages)
            ),
        )
        for stages, b in zip(layout, equal_shares(opts.global_batch, len(layout)), strict=True)
    ]
    return Plan(
        global_batch=opts.global_batch, pipelines=pipes, schedule=opts.schedule, optimizer=opts.optimizer, zero=zero
    )


def test_the_megatron_settings_built_from_shared_stages_are_the_plans_built_one_by_one() -> None:
    profile, cluster = _tp_instance()
    opts = PlanOptions(global_batch=16, max_stages=8)
    tables = CostTables(profile, cluster, optimizer=opts.optimizer)
    families = _uniform_families(profile, cluster, opts, None)
    assert sum(len(plans) for plans in families.values()) >= 4
    for name, plans in families.items():
        tp, pp = (int(x) for x in name.replace("TP ", "").split(" x PP "))
        layout = _megatron_layout(cluster, tp, pp, opts.global_batch)
        for plan in plans:
            m = max(plan.pipelines[0].micro_batches)
            recompute = plan.pipelines[0].stages[0].recompute
            assert plan == _plain_uniform_plan(layout, tables.n, opts, tp, m, recompute, plan.zero), name
        for a, b in itertools.pairwise(plans):
            assert a.pipelines is not b.pipelines  # each plan has a list of its own


def test_a_stage_without_its_degree_is_named_by_its_first_pipeline_and_stage() -> None:
    """The degree check looks each block, type and degree up once; a plan whose stages lack the
    degree is still refused naming the first such stage, as when every device was looked up."""
    profile = make_profile(2, times={"A100-80GB": (1.0, 2.0)})
    cluster = make_cluster([("n0", [("A100-80GB", 4)])])
    pipes = [
        Pipeline(2, (2,), (Stage(0, 2, (f"n0/{2 * i}", f"n0/{2 * i + 1}"), (1.0,), tensor_parallel=2),))
        for i in range(2)
    ]
    with pytest.raises(HetplanError) as raised:
        simulate(Plan(global_batch=4, pipelines=pipes), profile, cluster)
    assert "pipelines[0].stages[0]" in str(raised.value)

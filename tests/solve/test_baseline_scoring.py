"""Scoring the baselines without simulating what cannot win: the iteration bound, the Megatron-style
family best bound first, the homogeneous baselines at TP degrees, and the second process.

The bound must never exceed the simulation (else a family could be skipped that would have won);
the best-bound-first family must give exactly the baseline that simulating every family gives.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import replace

import brute_force
import pytest
from builders import make_cluster
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_optimality import _build, instances, tp_profile

from hetplan.contracts import load_catalog
from hetplan.contracts.plan import Plan
from hetplan.errors import HetplanError
from hetplan.profile.analytic import analytic_profile
from hetplan.simulate.bounds import iteration_lower_bound
from hetplan.simulate.simulator import simulate_if_fits
from hetplan.solve import PlanOptions
from hetplan.solve.background import Deferred
from hetplan.solve.baselines import (
    _fits,
    _uniform_families,
    baseline_plans,
    fastest_uniform_tp_pp,
    homogeneous_baselines,
    uniform_tp_pp_plans,
)
from hetplan.solve.tables import CostTables


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances(), pick=st.randoms(use_true_random=False))
def test_the_bound_never_exceeds_the_simulated_iteration(instance, pick) -> None:
    nodes, n_blocks, per_block, shape, batch, inter = instance
    profile, cluster = _build(nodes, min(n_blocks, 4), per_block, shape, inter)
    skeletons = list(itertools.islice(brute_force._skeletons(profile, cluster, batch), 400))
    checked = 0
    for pipelines in pick.sample(skeletons, min(12, len(skeletons))):
        plan = Plan(global_batch=batch, pipelines=pipelines, optimizer="adam")
        recompute = [pick.choice(("none", "selective", "full")) for _ in range(sum(len(p.stages) for p in pipelines))]
        it = iter(recompute)
        plan = replace(
            plan,
            pipelines=[
                replace(p, stages=tuple(replace(s, recompute=next(it)) for s in p.stages)) for p in plan.pipelines
            ],
            schedule=pick.choice(("1f1b", "gpipe")),
            zero=pick.choice((0, 1)),
        )
        for sync in ("allreduce", "sdpipe", "wsp"):
            variant = replace(plan, sync=sync)
            try:
                sim = simulate_if_fits(variant, profile, cluster)
            except HetplanError:
                continue  # a mode that cannot run this plan (ZeRO or TP under wsp/sdpipe, say)
            if sim is None:
                continue
            bound = iteration_lower_bound(variant, profile, cluster)
            assert bound <= sim.iteration_s * (1 + 1e-9), (sync, variant.pipelines)
            checked += 1
    assert checked or not skeletons or shape["activation_bytes"] > 0


def _tp_instance():
    """A small cluster where tensor parallelism, recomputation and ZeRO all matter: degree-2 blocks,
    activations that do not fit a V100 without help, two device types on three nodes."""
    speed = {"A100-80GB": 3.0, "V100-16GB": 1.0, "T4": 0.5}
    base = [(0.4, 0.9), (0.6, 1.1), (0.5, 1.0), (0.3, 0.8)] * 2
    profile = tp_profile(
        {t: [(f / s, b / s) for f, b in base] for t, s in speed.items()},
        n_blocks=8,
        params=300_000_000,
        activation_bytes=1.2e9,
        output_bytes=1e7,
        tp_speedup=1.8,
        allreduce_bytes=1e7,
        pair=1.6,
    )
    cluster = make_cluster(
        [("a", [("A100-80GB", 2)]), ("v0", [("V100-16GB", 4)]), ("v1", [("V100-16GB", 4)])],
        intra="50GB/s",
        inter="10GB/s",
        inter_latency="10us",
    )
    return profile, cluster


@pytest.mark.parametrize("batch", [8, 32])
def test_the_fastest_family_is_the_one_simulating_every_family_finds(batch) -> None:
    profile, cluster = _tp_instance()
    opts = PlanOptions(global_batch=batch, max_stages=8)
    every = uniform_tp_pp_plans(profile, cluster, opts, None)
    fitting = [c for c in every.values() if c is not None]
    assert len(fitting) >= 2, "the instance must offer a choice"
    expected = min(fitting, key=lambda c: c.sim.iteration_s)
    got = fastest_uniform_tp_pp(profile, cluster, opts, None)
    assert got is not None
    assert got.label == expected.label
    assert got.plan == expected.plan
    assert got.sim.iteration_s == expected.sim.iteration_s


def test_the_closed_form_looks_at_every_device_type_a_uniform_plan_lands_on() -> None:
    """Pipelines in file order start on the A100s; a later one on V100s must be checked too."""
    profile, cluster = _tp_instance()
    opts = PlanOptions(global_batch=8)
    tables = CostTables(profile, cluster, optimizer=opts.optimizer)
    families = _uniform_families(profile, cluster, opts, None)
    for configs in families.values():
        for plan in configs:
            assert _fits(plan, tables, cluster)
    # a 1-stage TP-1 plan over every device fits the A100s (80 GB) but not the V100s (16 GB)
    assert "TP 1 x PP 1" in families and not families["TP 1 x PP 1"]


def test_homogeneous_average_plans_where_the_profile_has_only_tp_degrees_for_big_blocks() -> None:
    """The averaged type gets times at every degree the real types share; without them a model
    that needs TP had no homogeneous_average plan at all (reported as not fitting)."""
    catalog = load_catalog()
    cluster = make_cluster([("a", [("A100-40GB", 4)]), ("v", [("V100-16GB", 4)])], inter="100Gbps")
    config = {"layers": 8, "hidden": 4096, "heads": 32, "seq": 2048, "vocab": 50272}
    profile = analytic_profile("gpt", config, devices=[catalog.get(t) for t in cluster.device_types], dtype="fp16")
    found = homogeneous_baselines(profile, cluster, PlanOptions(global_batch=16))
    average = found["homogeneous_average"]
    assert average is not None
    assert any(s.tensor_parallel > 1 for p in average.plan.pipelines for s in p.stages)


def _square(x: int) -> int:
    return x * x


def _fails(x: int) -> int:
    raise HetplanError(f"bad input {x}", field="x")


def _pid(_: int) -> int:
    return os.getpid()


def test_a_deferred_call_gives_the_same_answer_in_the_background_and_here() -> None:
    assert Deferred(_square, 7, background=True).result() == 49
    assert Deferred(_square, 7, background=False).result() == 49
    here = Deferred(_pid, 0, background=False).result()
    assert here == os.getpid()


def test_a_failure_in_the_background_is_raised_here_as_the_function_raises_it() -> None:
    with pytest.raises(HetplanError, match="bad input 3"):
        Deferred(_fails, 3, background=True).result()


def test_closing_a_deferred_call_stops_its_child_at_once() -> None:
    start = time.perf_counter()
    later = Deferred(time.sleep, 30, background=True)
    later.close()
    assert time.perf_counter() - start < 10


def test_baselines_are_the_same_with_or_without_a_second_process() -> None:
    profile, cluster = _tp_instance()
    opts = PlanOptions(global_batch=16, max_stages=8)
    here = baseline_plans(profile, cluster, opts, None, background=False)
    beside = baseline_plans(
        profile,
        cluster,
        opts,
        None,
        homogeneous=Deferred(homogeneous_baselines, profile, cluster, opts, background=True).result(),
        background=True,
    )
    assert list(here) == list(beside)
    for name in here:
        a, b = here[name], beside[name]
        assert (a is None) == (b is None), name
        if a is not None:
            assert a.plan == b.plan and a.sim.iteration_s == b.sim.iteration_s, name

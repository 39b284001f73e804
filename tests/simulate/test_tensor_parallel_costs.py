"""Tensor parallelism, recomputation and ZeRO-1 in the cost model, the simulator and the memory
walk: closed forms on tiny hand-built cases, and the search's tables agreeing with the walk."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from builders import make_cluster
from hypothesis import given, settings
from hypothesis import strategies as st

from hetplan.contracts.model_profile import Block, ModelProfile, SharedParams, TensorParallel, Timing
from hetplan.contracts.plan import Pipeline, Plan, Stage
from hetplan.errors import HetplanError
from hetplan.schedule.compile import compile_plan
from hetplan.simulate import simulate
from hetplan.simulate.costs import OPTIMIZER_STEP_BYTES
from hetplan.simulate.memory import plan_memory
from hetplan.solve.tables import CostTables

A100 = "A100-80GB"
BW, LAT = 1e11, 1e-5  # the node's own link: 100 GB/s, 10 us


def _timing(fwd: float, bwd: float, recompute: float | None = None) -> dict[str, dict[int, Timing]]:
    return {A100: {1: Timing(fwd, bwd, "estimated", recompute=recompute)}}


def tp_profile(dtype: str = "fp32") -> ModelProfile:
    """Two blocks: degree 1 fwd 1 / bwd 2 s a sample; degree 2 fwd 0.6 / bwd 1.2, recompute 0.25,
    a 1 GB all-reduce a sample; numbers chosen to be checked by hand."""
    d = 4 if dtype == "fp32" else 2
    blocks = []
    for i, (params, act, sel, shard_params, shard_act, shard_sel) in enumerate(
        [(1000, 5000.0, 0.0, 600, 3000.0, 0.0), (2000, 9000.0, 4000.0, 1100, 5000.0, 2000.0)]
    ):
        blocks.append(
            Block(
                name=f"b{i}",
                kind="test",
                params=params,
                param_bytes=float(params * d),
                activation_bytes=act,
                output_bytes=800.0,
                flops_fwd=0.0,
                times=_timing(1.0, 2.0, 0.5 if sel else None),
                selective_bytes=sel,
                tensor_parallel={
                    2: TensorParallel(
                        params=shard_params,
                        param_bytes=float(shard_params * d),
                        activation_bytes=shard_act,
                        allreduce_bytes=1e9,
                        selective_bytes=shard_sel,
                        times=_timing(0.6, 1.2, 0.25 if shard_sel else None),
                    )
                },
            )
        )
    return ModelProfile(model={"name": "tp"}, dtype=dtype, blocks=blocks, input_bytes=100.0)


def cluster(nodes: int = 1, per_node: int = 4):
    return make_cluster([(f"n{i}", [(A100, per_node)]) for i in range(nodes)], intra=BW, intra_latency=LAT)


def one_stage_plan(devices: list[str], micro: list[int], *, tp: int = 1, recompute: str = "none", **kw) -> Plan:
    stage = Stage(0, 2, tuple(devices), (1.0,) * (len(devices) // tp), tensor_parallel=tp, recompute=recompute)
    batch = sum(micro)
    return Plan(global_batch=batch, pipelines=[Pipeline(batch, tuple(micro), (stage,))], optimizer="sgd", **kw)


def ring(nbytes: float, n: int) -> float:
    return 2 * (n - 1) / n * nbytes / BW + 2 * (n - 1) * LAT


# ------------------------------------------------------------------------------------------ time
def test_a_tp2_member_computes_at_its_degree_plus_the_all_reduces() -> None:
    profile, c = tp_profile(), cluster()
    plan = one_stage_plan(["n0/0", "n0/1"], [2, 2], tp=2)
    result = simulate(plan, profile, c)
    ar = ring(1e9 * 2, 2)  # one block's all-reduce for a micro-batch of 2 samples: 0.02 s + 2 latencies
    fwd = 2 * (0.6 * 2 + ar)
    bwd = 2 * (1.2 * 2 + ar)
    assert result.stages[0].fwd_s == pytest.approx(2 * fwd, rel=1e-12)
    assert result.stages[0].bwd_s == pytest.approx(2 * bwd, rel=1e-12)
    step = (600 + 1100) * OPTIMIZER_STEP_BYTES["sgd"] / c.device("n0/0").type.memory_bandwidth
    assert result.iteration_s == pytest.approx(2 * fwd + 2 * bwd + step, rel=1e-12)
    assert result.devices["n0/0"].optimizer_s == pytest.approx(step, rel=1e-12)  # the shard's step


@pytest.mark.parametrize(
    ("recompute", "extra"),
    [
        ("none", 0.0),
        ("full", 2 * (0.6 * 2 + ring(2e9, 2))),  # the forward again, its all-reduces included
        ("selective", 0.25 * 2),  # the attention core of block 1 only (block 0 drops nothing)
    ],
)
def test_recompute_adds_to_each_backward(recompute: str, extra: float) -> None:
    profile, c = tp_profile(), cluster()
    result = simulate(one_stage_plan(["n0/0", "n0/1"], [2], tp=2, recompute=recompute), profile, c)
    assert result.stages[0].bwd_s == pytest.approx(2 * (1.2 * 2 + ring(2e9, 2)) + extra, rel=1e-12)
    whole = simulate(one_stage_plan(["n0/0"], [2], recompute=recompute), profile, c)
    extra1 = {"none": 0.0, "full": 2 * 2 * 1.0, "selective": 0.5 * 2}[recompute]
    assert whole.stages[0].bwd_s == pytest.approx(2 * 2 * 2.0 + extra1, rel=1e-12)


def test_zero1_replaces_the_all_reduce_by_reduce_scatter_step_on_the_shard_and_all_gather() -> None:
    profile, c = tp_profile(), cluster()
    stage0 = Stage(0, 2, ("n0/0",), (1.0,))
    stage1 = Stage(0, 2, ("n0/1",), (1.0,))
    base = Plan(global_batch=2, pipelines=[Pipeline(1, (1,), (stage0,)), Pipeline(1, (1,), (stage1,))], optimizer="sgd")
    zero = Plan(global_batch=2, pipelines=base.pipelines, optimizer="sgd", zero=1)
    nbytes = (1000 + 2000) * 4.0  # fp32 gradients of both blocks, one group
    bw = c.device("n0/0").type.memory_bandwidth
    step = 3000 * OPTIMIZER_STEP_BYTES["sgd"] / bw
    compute = 2 * 1.0 + 2 * 2.0
    plain = simulate(base, profile, c)
    assert plain.iteration_s == pytest.approx(compute + ring(nbytes, 2) + step, rel=1e-12)
    sharded = simulate(zero, profile, c, timeline=True)
    # reduce-scatter and all-gather: each half a ring all-reduce, (n-1)/n bytes/bw + (n-1) latency
    half = ring(nbytes, 2) / 2
    assert half == pytest.approx(nbytes / 2 / BW + LAT)
    assert sharded.iteration_s == pytest.approx(compute + half + step / 2 + half, rel=1e-12)
    assert sharded.devices["n0/0"].optimizer_s == pytest.approx(step / 2, rel=1e-12)
    labels = {label for _, kind, _, _, label in sharded.timeline if kind == "allreduce"}
    assert labels == {"reduce-scatter of gradient group 0", "all-gather of gradient group 0"}


def test_a_tp_stage_on_blocks_without_the_degree_is_a_located_error() -> None:
    profile, c = tp_profile(), cluster()
    plan = one_stage_plan(["n0/0", "n0/1", "n0/2", "n0/3"], [1], tp=4)
    with pytest.raises(HetplanError, match="no tensor-parallel degree 4") as err:
        simulate(plan, profile, c)
    assert err.value.field == "pipelines[0].stages[0].tensor_parallel" and "\n" not in str(err.value)


def test_allreduce_in_time_is_not_added_again() -> None:
    profile, c = tp_profile(), cluster()
    for block in profile.blocks:
        old = block.tensor_parallel[2]
        block.tensor_parallel[2] = TensorParallel(
            old.params, old.param_bytes, old.activation_bytes, old.allreduce_bytes, old.times, old.selective_bytes, True
        )
    result = simulate(one_stage_plan(["n0/0", "n0/1"], [2], tp=2), profile, c)
    assert result.stages[0].fwd_s == pytest.approx(2 * 0.6 * 2, rel=1e-12)


# ---------------------------------------------------------------------------------------- memory
@pytest.mark.parametrize(
    ("recompute", "held", "workspace"),
    [
        ("none", 3000 + 5000 + 800, 5000),  # saved activations at degree 2 + the output; largest block
        ("selective", 3000 + (5000 - 2000) + 800, 5000 + 2000),  # internals dropped, one block's restored
        ("full", (100 + 800) + 800, 2 * 5000),  # each block's input + the output; one block's whole + workspace
    ],
)
@pytest.mark.parametrize("zero", [0, 1])
def test_memory_walk_by_closed_form(recompute: str, held: float, workspace: float, zero: int) -> None:
    profile, c = tp_profile("fp16"), cluster(nodes=2)
    stages = [Stage(0, 2, (f"n{i}/0", f"n{i}/1"), (1.0,), tensor_parallel=2, recompute=recompute) for i in range(2)]
    plan = Plan(
        global_batch=8,
        pipelines=[Pipeline(4, (2, 2), (s,)) for s in stages],
        schedule="gpipe",
        optimizer="adam",
        zero=zero,
    )
    memory = plan_memory(compile_plan(plan, 2), profile, c, optimizer="adam", plan=plan)
    params = 600 + 1100  # one shard's
    for use in memory.values():
        assert use.weights == 2 * params  # fp16 weights
        assert use.gradients == 4 * params  # fp32 gradient buffers stay whole under ZeRO-1
        assert use.optimizer == pytest.approx((8 + 4) * params / (2 if zero else 1))  # Adam + master copy
        # GPipe holds both micro-batches of 2 samples; the first backward adds the workspace
        assert use.activations == pytest.approx(max(held * 2 * 2 + workspace * 2, 4 * params))
        assert use.peak_micro_batches == 2


# ------------------------------------------------------- the search's tables agree with the walk
def _random_profile(draw, n: int, dtype: str) -> ModelProfile:
    d = 4 if dtype == "fp32" else 2
    blocks = []
    for i in range(n):
        # magnitudes from nothing to more than an 80 GB device holds, so both answers occur
        params = draw(st.sampled_from([10**7, 10**8, 10**9, 4 * 10**9])) + draw(st.integers(0, 10**6))
        act = float(draw(st.sampled_from([10**6, 10**8, 10**9, 10**10])) + draw(st.integers(0, 10**6)))
        sel = act * draw(st.sampled_from([0.0, 0.3, 0.8]))
        shards = {}
        for t in (2, 4):
            p_t = params // t + draw(st.integers(0, 10**6))
            a_t = act / t + draw(st.integers(0, 10**8))
            shards[t] = TensorParallel(
                params=min(p_t, params),
                param_bytes=float(min(p_t, params) * d),
                activation_bytes=a_t,
                allreduce_bytes=1e6,
                selective_bytes=sel / t,
                times=_timing(0.1, 0.2, 0.05),
            )
        blocks.append(
            Block(
                name=f"b{i}",
                kind="test",
                params=params,
                param_bytes=float(params * d),
                activation_bytes=act,
                output_bytes=float(draw(st.integers(0, 10**8))),
                flops_fwd=0.0,
                times=_timing(0.2, 0.4, 0.1),
                selective_bytes=sel,
                tensor_parallel=shards,
            )
        )
    shared = []
    for k in range(draw(st.integers(0, 2))):  # tied parameters: a copy on every stage holding one
        holders = tuple(sorted(draw(st.sets(st.integers(0, n - 1), min_size=2, max_size=n))))
        params = draw(st.sampled_from([10**7, 10**8, 10**9])) + draw(st.integers(0, 10**6))
        tp_params = {t: params // t + draw(st.integers(0, 10**3)) for t in (2, 4) if draw(st.booleans())}
        shared.append(
            SharedParams(
                name=f"s{k}",
                params=params,
                param_bytes=float(params * d),
                blocks=holders,
                tensor_parallel={t: (p, float(p * d)) for t, p in tp_params.items()},
            )
        )
    return ModelProfile(
        model={"name": "r"},
        dtype=dtype,
        blocks=blocks,
        input_bytes=float(draw(st.integers(0, 10**6))),
        shared=shared,
    )


@st.composite
def cases(draw):
    n = draw(st.integers(2, 5))
    dtype = draw(st.sampled_from(["fp32", "fp16"]))
    profile = _random_profile(draw, n, dtype)
    n_stages = draw(st.integers(1, min(3, n)))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), min_size=n_stages - 1, max_size=n_stages - 1)))
    cuts = [0, *cuts, n]
    degrees = [draw(st.sampled_from([1, 2, 4])) for _ in range(n_stages)]
    recompute = [draw(st.sampled_from(["none", "selective", "full"])) for _ in range(n_stages)]
    n_pipes = draw(st.integers(1, 2))
    micro = tuple([draw(st.integers(1, 3))] * draw(st.integers(1, 4)))
    pipelines = []
    for pi in range(n_pipes):
        stages, used = [], 0
        for s in range(n_stages):
            t = degrees[s]
            devices = tuple(f"n{pi}/{used + k}" for k in range(t))
            used += t
            stages.append(Stage(cuts[s], cuts[s + 1], devices, (1.0,), tensor_parallel=t, recompute=recompute[s]))
        pipelines.append(Pipeline(sum(micro), micro, tuple(stages)))
    plan = Plan(
        global_batch=n_pipes * sum(micro),
        pipelines=pipelines,
        schedule=draw(st.sampled_from(["1f1b", "gpipe"])),
        optimizer=draw(st.sampled_from(["sgd", "adam"])),
        zero=draw(st.sampled_from([0, 1])) if n_pipes > 1 and not profile.shared else 0,  # ZeRO-1 refuses ties
    )
    return profile, plan


@settings(max_examples=60, deadline=None, derandomize=True)
@given(case=cases())
def test_tables_memory_agrees_with_the_walk(case) -> None:
    profile, plan = case
    c = cluster(nodes=2, per_node=12)
    memory = plan_memory(compile_plan(plan, len(profile.blocks)), profile, c, optimizer=plan.optimizer, plan=plan)
    tables = CostTables(profile, c, optimizer=plan.optimizer)
    n_pipes = len(plan.pipelines)
    for p in plan.pipelines:
        n_micro, n_stages = len(p.micro_batches), len(p.stages)
        for si, s in enumerate(p.stages):
            in_flight = n_micro if plan.schedule == "gpipe" else min(n_stages - si, n_micro)
            kwargs = {
                "m": p.micro_batches[0],
                "in_flight": in_flight,
                "tp": s.tensor_parallel,
                "recompute": s.recompute,
                "zero_holders": n_pipes if plan.zero else 1,
                "reduced": n_pipes > 1,
                "n_micro": n_micro,
            }
            device_type = c.device(s.devices[0]).type
            need = tables.stage_memory(device_type, s.start, s.end, **kwargs)
            for address in s.devices:
                walk = memory[address]
                assert need == pytest.approx(walk.tensor_bytes, rel=1e-9)
                if abs(walk.total - walk.capacity) > 1e-6 * walk.capacity:
                    assert tables.fits(device_type, s.start, s.end, **kwargs) == walk.fits


def test_tables_time_and_memory_of_ranges_past_blocks_without_the_degree() -> None:
    """An embedding with degree 1 only (as Sailor's import has it): ranges of layers after it still
    have every degree."""
    from dataclasses import replace

    from hetplan.contracts import load_catalog
    from hetplan.profile.analytic import analytic_profile
    from hetplan.simulate.costs import CostModel

    catalog = load_catalog()
    config = {"layers": 3, "hidden": 64, "heads": 4, "seq": 16, "vocab": 100}
    analytic = analytic_profile("gpt", config, devices=[catalog.get(A100)], dtype="fp16")
    blocks = [replace(analytic.blocks[0], tensor_parallel={}), *analytic.blocks[1:]]
    profile = replace(analytic, blocks=blocks)
    c = cluster()
    tables = CostTables(profile, c, optimizer="adam")
    device = c.device("n0/0")
    assert tables.tp_options(1, 7) == (1, 2, 4) and tables.tp_options(0, 7) == (1,)
    costs = CostModel(profile, c, optimizer="adam")
    for tp in (2, 4):
        for recompute in ("none", "selective", "full"):
            expected = costs.compute(device, 3, 7, 2, backward=False, tp=tp, recompute=recompute) + costs.compute(
                device, 3, 7, 2, backward=True, tp=tp, recompute=recompute
            )
            got = tables.stage_time(A100, 2, 3, 7, tp=tp, recompute=recompute, tp_link=c.node("n0").link)
            assert got == pytest.approx(expected, rel=1e-12)
            assert tables.stage_memory(device.type, 3, 7, m=2, in_flight=2, tp=tp, recompute=recompute) < float("inf")
    assert math.isnan(tables.stage_time(A100, 2, 0, 7, tp=2, tp_link=c.node("n0").link))  # the embedding lacks 2
    assert tables.stage_memory(device.type, 0, 7, m=2, in_flight=2, tp=2) == float("inf")


# ------------------------------------------------------------------ split boundary sends (§14.1)
def _spans(result, label: str) -> list[float]:
    return [hi - lo for _, _, lo, hi, text in result.timeline if text == label]


@pytest.mark.parametrize(("ts", "tr"), [(2, 2), (2, 4), (4, 2), (1, 2)])
def test_split_boundary_sends_carry_a_chunk_each_then_the_receivers_all_gather(ts: int, tr: int) -> None:
    """Member k of a degree-tr receiver gets chunk k (1/tr of the 3-sample, 2400-byte boundary) from
    sender member k mod ts, and the receivers all-gather the whole buffer in a ring over their node;
    gradients go back the same way, chunked by the sender stage's degree."""
    profile = tp_profile()
    profile.blocks = [
        replace(b, tensor_parallel={**b.tensor_parallel, 4: b.tensor_parallel[2]}) for b in profile.blocks
    ]
    senders = tuple(f"n0/{i}" for i in range(ts))
    receivers = tuple(f"n0/{ts + i}" for i in range(tr))
    stages = (Stage(0, 1, senders, (1.0,), tensor_parallel=ts), Stage(1, 2, receivers, (1.0,), tensor_parallel=tr))
    plan = Plan(global_batch=3, pipelines=[Pipeline(3, (3,), stages)], optimizer="sgd")
    result = simulate(plan, profile, cluster(per_node=8), timeline=True)
    whole = 800.0 * 3
    for k, dst in enumerate(receivers):
        src = senders[k % ts]
        part = whole / tr if tr > 1 else whole
        assert _spans(result, f"transfer of micro-batch 0 {src} -> {dst}") == [pytest.approx(part / BW + LAT)]
    for k, dst in enumerate(senders):  # gradients: sender member k from receiver member k mod tr
        src = receivers[k % tr]
        part = whole / ts if ts > 1 else whole
        assert _spans(result, f"transfer of micro-batch 0 {src} -> {dst}") == [pytest.approx(part / BW + LAT)]
    gathers = [(text, hi - lo) for _, kind, lo, hi, text in result.timeline if "boundary all-gather" in text]
    expected = {"stage 1": tr, "stage 0": ts}
    for stage, degree in expected.items():
        mine = [d for text, d in gathers if stage in text]
        if degree == 1:
            assert not mine
        else:  # drawn once on each member
            assert mine == [pytest.approx(ring(whole, degree) / 2)] * degree


def test_split_pieces_cover_the_buffer_once_where_the_degree_does_not_divide_it() -> None:
    """15 elements (3 samples of 5) into a degree-4 replica fed by two senders ([0, 2) and [2, 3)):
    chunks of ceil(15/4) = 4 elements, the last one 3; every element arrives exactly once."""
    from hetplan.schedule.boundary import chunk, piece
    from hetplan.schedule.compile import DeviceProgram

    group = tuple(f"n0/{k}" for k in range(4))
    members = [DeviceProgram(a, 0, 1, 0, 1, 2, (3,), (0,), tp_group=group, tp_rank=k) for k, a in enumerate(group)]
    assert [chunk(m, 0, 5) for m in members] == [(0, 4), (4, 8), (8, 12), (12, 15)]
    covered = []
    for m in members:
        for lo, hi in ((0, 2), (2, 3)):
            a, b = piece(lo, hi, 5, m, 0)
            covered.extend(range(a, b))
    assert sorted(covered) == list(range(15))
    whole = DeviceProgram("n1/0", 0, 1, 0, 1, 2, (3,), (0,))  # degree 1: not split
    assert piece(0, 2, 5, whole, 0) == (0, 10)

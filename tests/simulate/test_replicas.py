"""Pipelines that run alike, simulated once (``simulate.replicas``): every field of the folded result
equals the full simulation's, on the planner's own candidates and baselines and on random
hand-made plans (pipelines of several shapes, some sharing node interfaces, replicated and
tensor-parallel stages, recomputation, ZeRO-1, the sync modes)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from builders import make_cluster, make_profile

from hetplan.contracts import load_catalog
from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.plan import Pipeline, Plan, Stage, parse_plan
from hetplan.errors import HetplanError
from hetplan.profile.analytic import analytic_profile
from hetplan.schedule.compile import compile_plan
from hetplan.simulate import replicas, simulator
from hetplan.simulate.memory import plan_memory
from hetplan.simulate.replicas import fold_replicas, memory_copies
from hetplan.solve import PlanOptions, plan_training

A100, V100 = "A100-80GB", "V100-16GB"
SMALL_GPT = {"layers": 4, "hidden": 256, "heads": 8, "seq": 128, "vocab": 1000}


def _profile():
    catalog = load_catalog()
    return analytic_profile("gpt", SMALL_GPT, devices=[catalog.get(A100), catalog.get(V100)], dtype="fp16")


def _cluster(types: list[str], per_node: int = 4, **network):
    return make_cluster(
        [(f"n{i}", [(t, per_node)]) for i, t in enumerate(types)],
        inter="10Gbps",
        inter_latency="20us",
        intra_latency="5us",
        **network,
    )


def _full(plan, profile, cluster, monkeypatch, *, walked: bool):
    """The simulation with folding switched off."""
    with monkeypatch.context() as m:
        m.setattr(simulator, "fold_replicas", lambda plan, cluster: None)
        return _run(plan, profile, cluster, walked=walked)


def _run(plan, profile, cluster, *, walked: bool):
    if walked:  # the search's path: the memory walk first (pipelines compiled once), then the event run
        return simulator.simulate_if_fits(plan, profile, cluster)
    return simulator.simulate(plan, profile, cluster)


def _same(plan, profile, cluster, monkeypatch) -> bool:
    """Assert the folded and full results are equal, both ways in; return whether any pipeline folded."""
    for walked in (False, True):
        folded = _run(plan, profile, cluster, walked=walked)
        full = _full(plan, profile, cluster, monkeypatch, walked=walked)
        assert folded == full, plan.to_dict()
    return fold_replicas(plan, cluster) is not None


def _planner_plans(profile, cluster, **options):
    result = plan_training(profile, cluster, PlanOptions(**options))
    plans = [result.plan] + [c.plan for c in result.candidates]
    plans += [c.plan for c in result.baselines.values() if c is not None]
    return plans


@pytest.mark.parametrize(
    ("types", "options"),
    [
        ([A100, A100, V100, V100, V100, V100], {"global_batch": 96}),
        ([A100, A100, V100, V100, V100, V100], {"global_batch": 96, "schedule": "gpipe"}),
        ([A100] * 4 + [V100] * 4, {"global_batch": 256, "sync": "topk"}),
        ([V100] * 8, {"global_batch": 64, "sync": "adasum"}),
    ],
)
def test_the_planners_plans_simulate_the_same_folded(types, options, monkeypatch) -> None:
    profile, cluster = _profile(), _cluster(types)
    plans = _planner_plans(profile, cluster, **options)
    folded = sum(_same(plan, profile, cluster, monkeypatch) for plan in plans)
    assert folded >= 1, "no plan of the planner had pipelines that run alike: the test checks nothing"


def _random_plan(
    rng: random.Random, nodes: list[str], per_node: int, n_blocks: int, degrees: tuple[int, ...] = (1, 1, 2)
) -> Plan:
    """Pipelines of one to three shapes laid on the nodes, either each on nodes of its own or
    stage by stage across shared nodes; stages with replicas or a tensor-parallel degree."""
    shapes = []
    tp = rng.choice(degrees)  # every holder of a block at one degree (the plan contract's rule)
    for _ in range(rng.randint(1, 3)):
        n_stages = rng.randint(1, 3)
        cuts = sorted(rng.sample(range(1, n_blocks), n_stages - 1))
        bounds = [0, *cuts, n_blocks]
        stages = []
        for s in range(n_stages):
            count = tp * rng.choice((1, 1, 2))
            stages.append((bounds[s], bounds[s + 1], tp, count, rng.choice(("none", "none", "selective", "full"))))
        micro = tuple(rng.choice((1, 2, 3)) for _ in range(rng.randint(1, 4)))
        shapes.append((stages, micro))
    free = {n: [f"{n}/{i}" for i in range(per_node)] for n in nodes}
    interleave = rng.random() < 0.3  # each replica on the next node: pipelines share interfaces
    cursor = 0

    def take(count: int, tp: int) -> tuple[str, ...] | None:
        """``count`` devices, each tensor-parallel group of ``tp`` on one node."""
        nonlocal cursor
        out: list[str] = []
        for _ in range(count // tp):
            for step in range(len(nodes)):
                node = nodes[(cursor + step) % len(nodes)]
                if len(free[node]) >= tp:
                    out += free[node][:tp]
                    free[node] = free[node][tp:]
                    cursor = (cursor + step + int(interleave)) % len(nodes)
                    break
            else:
                return None
        return tuple(out)

    pipelines = []
    while len(pipelines) < 6:
        stages_of, micro = rng.choice(shapes)
        stages = []
        for start, end, tp, count, recompute in stages_of:
            devices = take(count, tp)
            if devices is None:
                break
            shares = (1.0 / (count // tp),) * (count // tp)
            stages.append(Stage(start, end, devices, shares, tensor_parallel=tp, recompute=recompute))
        if len(stages) < len(stages_of):
            break
        pipelines.append(Pipeline(sum(micro), micro, tuple(stages)))
        if rng.random() < 0.1:
            break
    return _with_random_sync(rng, pipelines, tp, "random plan")


def _with_random_sync(rng: random.Random, pipelines: list[Pipeline], tp: int, name: str) -> Plan:
    """A plan of ``pipelines`` with a random schedule and sync mode (Adasum only without TP, ZeRO-1
    only under the all-reduce), parsed as a plan file would be (what a plan file may hold, checked)."""
    plan = Plan(sum(p.batch for p in pipelines), pipelines, schedule=rng.choice(("1f1b", "gpipe")))
    plan.sync = rng.choice(("allreduce", "allreduce", "topk") + (("adasum",) if tp == 1 else ()))
    plan.zero = int(plan.sync == "allreduce" and rng.random() < 0.3)
    if plan.sync == "topk":
        plan.sync_options = {"ratio": 0.01}
    data = plan.to_dict() | {"inputs": {"profile": {"path": "-"}, "cluster": {"path": "-"}}}
    return parse_plan(data, file=name)


def test_random_plans_simulate_the_same_folded(monkeypatch) -> None:
    profile = _profile()
    rng = random.Random(7)
    folded = checked = 0
    for _ in range(60):
        types = [rng.choice((A100, V100)) for _ in range(rng.randint(2, 6))]
        cluster = _cluster(types, per_node=4)
        try:
            plan = _random_plan(rng, [n.name for n in cluster.nodes], 4, len(profile.blocks))
            simulator.simulate(plan, profile, cluster)
        except HetplanError as exc:  # a random plan the contract refuses (say, a degree a block lacks)
            assert "deadlock" not in str(exc), plan.to_dict()
            continue
        checked += 1
        folded += _same(plan, profile, cluster, monkeypatch)
    assert checked >= 40 and folded >= 15, (checked, folded)


def test_random_plans_of_a_tied_model_simulate_the_same_folded(monkeypatch) -> None:
    """A tied head (the profile's ``shared`` table): its all-reduce spans the embedding's and the
    head's holders of every pipeline, a collective like the gradient groups' that folding keeps."""
    catalog = load_catalog()
    config = {**SMALL_GPT, "head": "tied"}
    profile = analytic_profile("gpt", config, devices=[catalog.get(A100), catalog.get(V100)], dtype="fp16")
    assert profile.shared
    rng = random.Random(11)
    folded = checked = 0
    for _ in range(40):
        cluster = _cluster([rng.choice((A100, V100)) for _ in range(rng.randint(2, 6))], per_node=4)
        try:
            plan = _random_plan(rng, [n.name for n in cluster.nodes], 4, len(profile.blocks))
            plan.sync, plan.zero, plan.sync_options = "allreduce", 0, {}  # what ties run under
            simulator.simulate(plan, profile, cluster)
        except HetplanError as exc:
            assert "deadlock" not in str(exc), plan.to_dict()
            continue
        checked += 1
        folded += _same(plan, profile, cluster, monkeypatch)
    assert checked >= 25 and folded >= 10, (checked, folded)


@pytest.mark.parametrize("times", [{A100: (1.0, 2.0), V100: (2.0, 4.0)}, {A100: (0.0, 0.0), V100: (0.0, 0.0)}])
def test_random_plans_built_to_tie_simulate_the_same_folded(times, monkeypatch) -> None:
    """Whole-second and zero block times: collectives, computes and transfers end at equal floats,
    where the critical path's naming depends on the engine's order of events."""
    profile = make_profile(6, times=times, params=1_000_000, activation_bytes=1e6, output_bytes=1e6)
    rng = random.Random(3)
    folded = checked = 0
    for _ in range(40):
        cluster = _cluster([rng.choice((A100, V100)) for _ in range(rng.randint(2, 5))], per_node=4)
        try:
            plan = _random_plan(rng, [n.name for n in cluster.nodes], 4, len(profile.blocks), degrees=(1,))
            simulator.simulate(plan, profile, cluster)
        except HetplanError as exc:
            assert "deadlock" not in str(exc)
            continue
        checked += 1
        folded += _same(plan, profile, cluster, monkeypatch)
    assert checked >= 25 and folded >= 10, (checked, folded)


def test_a_profile_changed_in_place_is_priced_afresh() -> None:
    """The cost model and the memory walk's figures are kept per profile across simulations; a
    block replaced in the profile's list is seen (as a profile built anew would be)."""
    profile, cluster = _profile(), _cluster([A100, A100], per_node=1)
    n = len(profile.blocks)
    plan = Plan(4, [Pipeline(2, (1, 1), (Stage(0, n, (f"n{k}/0",), (1.0,)),)) for k in range(2)])
    before = simulator.simulate(plan, profile, cluster)
    slower = replace(
        profile.blocks[1],
        times={t: {m: replace(x, fwd=10 * x.fwd) for m, x in by.items()} for t, by in profile.blocks[1].times.items()},
        params=10 * profile.blocks[1].params,
    )
    profile.blocks[1] = slower
    after = simulator.simulate(plan, profile, cluster)
    fresh = _profile()
    fresh.blocks[1] = slower
    assert after == simulator.simulate(plan, fresh, cluster)
    assert after.iteration_s > before.iteration_s
    assert after.devices["n0/0"].memory.optimizer > before.devices["n0/0"].memory.optimizer


def test_pipelines_sharing_a_node_interface_are_not_folded() -> None:
    cluster = _cluster([A100, A100])
    # two pipelines n0 -> n1, each stage on another node: both send over n0's and n1's interfaces
    pipelines = [
        Pipeline(2, (1, 1), (Stage(0, 4, (f"n0/{k}",), (1.0,)), Stage(4, len(_profile().blocks), (f"n1/{k}",), (1.0,))))
        for k in range(2)
    ]
    plan = Plan(4, pipelines)
    assert fold_replicas(plan, cluster) is None
    # on nodes of their own they are folded: the last pipeline of the class runs, the first copies it
    own = _cluster([A100, A100, A100, A100], per_node=1)
    n = len(_profile().blocks)
    plan = Plan(
        4,
        [
            Pipeline(2, (1, 1), (Stage(0, 4, (f"n{2 * k}/0",), (1.0,)), Stage(4, n, (f"n{2 * k + 1}/0",), (1.0,))))
            for k in range(2)
        ],
    )
    folding = fold_replicas(plan, own)
    assert folding is not None
    assert folding.copy_of == {"n0/0": "n2/0", "n1/0": "n3/0"} and folding.pipeline_copy_of == {0: 1}
    assert folding.first_device == {"n2/0": "n0/0", "n3/0": "n1/0"}
    for sync in ("sdpipe", "wsp"):
        assert fold_replicas(replace(plan, sync=sync), own) is None


def test_pipelines_on_other_types_or_links_are_not_folded() -> None:
    n = len(_profile().blocks)
    plan = Plan(4, [Pipeline(2, (1, 1), (Stage(0, n, (f"n{k}/0",), (1.0,)),)) for k in range(2)])
    assert fold_replicas(plan, _cluster([A100, V100], per_node=1)) is None
    assert fold_replicas(plan, _cluster([A100, A100], per_node=1)) is not None
    two = Plan(
        4,
        [Pipeline(2, (1, 1), (Stage(0, 4, (f"n{k}/0",), (1.0,)), Stage(4, n, (f"n{k}/1",), (1.0,)))) for k in range(2)],
    )
    slow = make_cluster([("n0", [(A100, 2)]), ("n1", [(A100, 2)])], intra="600GB/s")
    assert fold_replicas(two, slow) is not None
    data = {
        "schema": "hetplan/cluster/v1",
        "name": "t",
        "nodes": [
            {"name": "n0", "devices": [{"type": A100, "count": 2}], "link": {"bandwidth": "600GB/s"}},
            {"name": "n1", "devices": [{"type": A100, "count": 2}], "link": {"bandwidth": "100GB/s"}},
        ],
        "network": {"bandwidth": "10Gbps"},
    }
    assert fold_replicas(two, parse_cluster(data, file="t")) is None  # the second's stages talk slower


def test_skipped_pipelines_compile_without_actions_and_the_rest_as_before() -> None:
    profile, cluster = _profile(), _cluster([A100, A100, A100, A100], per_node=1)
    n = len(profile.blocks)
    plan = Plan(
        4,
        [
            Pipeline(2, (1, 1), (Stage(0, 4, (f"n{2 * k}/0",), (1.0,)), Stage(4, n, (f"n{2 * k + 1}/0",), (1.0,))))
            for k in range(2)
        ],
    )
    full, part = compile_plan(plan, n), compile_plan(plan, n, skip={0})
    assert part.skipped == {0} and not full.skipped
    assert list(part.programs) == list(full.programs) and part.groups == full.groups
    assert all(not part.programs[a].actions for a in ("n0/0", "n1/0"))
    assert all(part.programs[a].actions == full.programs[a].actions for a in ("n2/0", "n3/0"))
    assert [t for t in full.transfers if t.pipeline == 1] == part.transfers
    copies = memory_copies(plan, fold_replicas(plan, cluster))
    assert plan_memory(part, profile, cluster, optimizer="adam", plan=plan, copies=copies) == plan_memory(
        full, profile, cluster, optimizer="adam", plan=plan
    )


def test_a_512_device_plan_runs_two_pipelines_and_names_the_full_critical_path(monkeypatch) -> None:
    """The bundled 512-device cluster's plan: every figure as the full run's, from a fraction of
    the tasks."""
    from pathlib import Path

    from hetplan.contracts import load_cluster

    root = Path(__file__).resolve().parents[2]
    cluster = load_cluster(root / "profiles" / "clusters" / "scale-a100-v100.yaml")
    catalog = load_catalog()
    profile = analytic_profile(
        "gpt", SMALL_GPT | {"layers": 8}, devices=[catalog.get(t) for t in cluster.device_types], dtype="fp16"
    )
    n = len(profile.blocks)
    per_pipeline = 8
    devices = [d.address for d in cluster.devices]
    pipelines = []
    for k in range(len(devices) // per_pipeline):
        mine = devices[k * per_pipeline : (k + 1) * per_pipeline]
        cuts = [round(i * n / 4) for i in range(5)]
        stages = tuple(
            Stage(cuts[i], cuts[i + 1], tuple(mine[2 * i : 2 * i + 2]), (1.0,), tensor_parallel=2) for i in range(4)
        )
        pipelines.append(Pipeline(8, (2, 2, 2, 2), stages))
    plan = Plan(8 * len(pipelines), pipelines)
    folding = fold_replicas(plan, cluster)
    assert folding is not None and len(folding.kept) <= 3 * per_pipeline
    assert _same(plan, profile, cluster, monkeypatch)
    assert replicas.FOLDED_SYNC_MODES == ("allreduce", "adasum", "topk")


def _component_plan(
    rng: random.Random, n_blocks: int, per_node: int, copies: int, n_stages: int, degrees: tuple[int, ...] = (1, 2)
) -> Plan:
    """``copies`` copies of one random group of pipelines that share node interfaces (as Megatron's
    TP 4 on 8-device nodes lays two pipelines on every node of a stage), each copy on nodes of its
    own; within the group, pipelines differ in micro-batches and recomputation."""
    members = rng.choice((2, 2, 3))
    tp = rng.choice(degrees) if members * 2 <= per_node else 1
    cuts = [0, *sorted(rng.sample(range(1, n_blocks), n_stages - 1)), n_blocks]
    micro = [tuple(rng.choice((1, 2)) for _ in range(rng.randint(1, 3))) for _ in range(members)]
    recompute = [rng.choice(("none", "selective", "full")) for _ in range(members)]
    pipelines = []
    for c in range(copies):
        for j in range(members):
            stages = []
            for s in range(n_stages):
                node = c * n_stages + s  # stage s of every member on one node
                devices = tuple(f"n{node}/{j * tp + i}" for i in range(tp))
                stages.append(Stage(cuts[s], cuts[s + 1], devices, (1.0,), tensor_parallel=tp, recompute=recompute[j]))
            pipelines.append(Pipeline(sum(micro[j]), micro[j], tuple(stages)))
    return _with_random_sync(rng, pipelines, tp, "component plan")


@pytest.mark.parametrize("tie", [False, True], ids=["analytic", "built-to-tie"])
def test_groups_of_pipelines_sharing_interfaces_fold_as_one(tie: bool, monkeypatch) -> None:
    """Pipelines whose transfers share node interfaces run as a group; copies of the group on nodes
    of their own run alike, so the last copy is simulated and the others copy it, member by member:
    every field equal to the full simulation's (with whole-second and zero times too, where the
    order of events at equal times names the critical path)."""
    times = {A100: (1.0, 2.0), V100: (2.0, 4.0)}
    tied = make_profile(6, times=times, params=1_000_000, activation_bytes=1e6, output_bytes=1e6)
    profile = tied if tie else _profile()
    rng = random.Random(5)
    folded = 0
    for _ in range(20):
        n_stages, copies = rng.randint(2, 3), rng.randint(2, 3)
        cluster = _cluster([rng.choice((A100, V100)) for _ in range(n_stages)] * copies, per_node=4)
        plan = _component_plan(rng, len(profile.blocks), 4, copies, n_stages, (1,) if tie else (1, 2))
        folding = fold_replicas(plan, cluster)
        assert folding is not None, plan.to_dict()
        members = len(plan.pipelines) // copies
        assert folding.pipeline_copy_of == {
            c * members + j: (copies - 1) * members + j for c in range(copies - 1) for j in range(members)
        }
        folded += _same(plan, profile, cluster, monkeypatch)
    assert folded == 20


def test_groups_whose_counterparts_come_in_another_order_are_not_folded(monkeypatch) -> None:
    """Two groups alike but for the order of their pipelines (the first group's pipelines are 0 and
    3, the second's 1 and 2): the engine takes counterparts in pipeline order and the representative
    must come last for every member, so they are simulated whole."""
    profile, cluster = _profile(), _cluster([A100] * 4, per_node=2)
    n = len(profile.blocks)

    def pipe(node: int, device: int) -> Pipeline:
        stages = (Stage(0, 4, (f"n{node}/{device}",), (1.0,)), Stage(4, n, (f"n{node + 1}/{device}",), (1.0,)))
        return Pipeline(2, (1, 1), stages)

    plan = Plan(8, [pipe(0, 0), pipe(2, 0), pipe(2, 1), pipe(0, 1)])
    assert fold_replicas(plan, cluster) is None
    assert not _same(plan, profile, cluster, monkeypatch)
    ordered = Plan(8, [pipe(0, 0), pipe(0, 1), pipe(2, 0), pipe(2, 1)])
    assert fold_replicas(ordered, cluster).pipeline_copy_of == {0: 2, 1: 3}
    assert _same(ordered, profile, cluster, monkeypatch)

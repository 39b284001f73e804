"""Planning two jobs for the same GPUs (``hetplan co-plan``): the fairness bound holds in what is
written, the files are plan files the other commands take, the same inputs give the same bytes, and
bad input is one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from builders import make_cluster, make_profile

from hetplan.cli import main
from hetplan.contracts.cluster import load_cluster
from hetplan.contracts.model_profile import load_profile
from hetplan.contracts.paths import bundled_profiles_dir
from hetplan.contracts.plan import load_plan
from hetplan.errors import HetplanError
from hetplan.simulate.together import POLICIES, RUNTIME_POLICIES, simulate_together
from hetplan.simulate.together_files import load_jobs
from hetplan.solve.coplan import (
    CoPlanOptions,
    choose,
    co_plan,
    co_plan_candidates,
    co_plan_files,
    restrict,
    shared_memory,
    split_devices,
    write_co_plan,
)

A100, V100 = "A100-80GB", "V100-16GB"
CLUSTERS = bundled_profiles_dir() / "clusters"


def _cluster_file(tmp_path: Path, per_node: int = 2) -> Path:
    """Two nodes of ``per_node`` GPUs on a slow network: transfers and all-reduces leave gaps to fill."""
    link = {"bandwidth": "300GB/s", "latency": 0}
    data = {
        "schema": "hetplan/cluster/v1",
        "name": "two-nodes",
        "nodes": [
            {"name": "n0", "devices": [{"type": A100, "count": per_node}], "link": link},
            {"name": "n1", "devices": [{"type": V100, "count": per_node}], "link": link},
        ],
        "network": {"bandwidth": "1GB/s", "latency": "20us"},
    }
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _profile_files(tmp_path: Path) -> tuple[Path, Path]:
    a = make_profile(
        6, times={A100: (0.002, 0.004), V100: (0.004, 0.008)}, params=20_000_000, output_bytes=4e6, activation_bytes=1e6
    )
    b = make_profile(
        4, times={A100: (0.003, 0.006), V100: (0.006, 0.012)}, params=50_000_000, output_bytes=1e6, activation_bytes=1e6
    )
    paths = (tmp_path / "a.profile.yaml", tmp_path / "b.profile.yaml")
    a.save(paths[0])
    b.save(paths[1])
    return paths


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as on a wide terminal, so no name is cut short or wrapped."""
    import hetplan.cli as cli

    monkeypatch.setattr(cli.console, "_width", 250)


SMALL = {"per_job": 5, "max_pairs": 4, "memory_shares": (0.5,), "iterations": 4, "refine": False}


def test_split_gives_each_job_half_of_every_node() -> None:
    first, second = split_devices(load_cluster(CLUSTERS / "rtx-mix.yaml"))
    assert first == tuple(f"node{n}/{i}" for n in range(3) for i in range(4))
    assert second == tuple(f"node{n}/{i}" for n in range(3) for i in range(4, 8))
    singles = make_cluster([("a", [(A100, 1)]), ("b", [(A100, 1)]), ("c", [(A100, 3)]), ("d", [(A100, 1)])])
    assert split_devices(singles) == (("a/0", "c/0", "c/1", "d/0"), ("b/0", "c/2"))
    with pytest.raises(HetplanError, match="one device"):
        split_devices(make_cluster([("a", [(A100, 1)])]))


def test_sub_clusters_keep_links_and_map_back() -> None:
    cluster = load_cluster(CLUSTERS / "rtx-mix.yaml")
    _, second = split_devices(cluster)
    sub, back = restrict(cluster, second, "second half")
    assert [d.address for d in sub.devices][:4] == ["node0/0", "node0/1", "node0/2", "node0/3"]
    assert [back[d.address] for d in sub.devices] == list(second)
    assert all(sub.device(a).type == cluster.device(back[a]).type for a in back)
    assert sub.node("node0").link == cluster.node("node0").link and sub.network == cluster.network
    half = shared_memory(cluster, 0.5)
    for name, t in cluster.device_types.items():
        assert half.device_types[name].memory == t.memory / 2
        assert half.device_types[name].reserve_bytes == t.reserve_bytes  # one CUDA context per job
        assert half.catalog.get(name).memory == t.memory / 2


def test_co_plan_keeps_both_jobs_within_the_fairness_bound(tmp_path: Path) -> None:
    """At 2.0 the best pair slows a job by more than 1.6x; at 1.6 another pair (or policy) is chosen
    within it; at 1.3 no pair qualifies: one line naming --fairness. Both policies are tried here
    (`--policy both`): under first-come alone this pair's best is already within 1.6x."""
    cluster_path = _cluster_file(tmp_path)
    a_path, b_path = _profile_files(tmp_path)
    opts = CoPlanOptions(batch_a=16, batch_b=16, policies=POLICIES, **SMALL)
    profiles = load_profile(a_path), load_profile(b_path)
    pools = co_plan_candidates(*profiles, load_cluster(cluster_path), opts)
    worst = {}
    for fairness in (2.0, 1.6):
        result = choose(pools, replace(opts, fairness=fairness))
        reference = [c.solo_s for c in result.reference]
        for t, ref in zip(result.chosen.iteration_s, reference, strict=True):
            assert t <= fairness * ref
        worst[fairness] = max(result.chosen.slowdowns(tuple(reference)))
        # the split it is printed beside was a candidate too: when fair, the choice is at least as good
        split = result.split
        if split is not None and max(split.slowdowns(tuple(reference))) <= fairness:
            assert result.chosen.samples_per_s >= split.samples_per_s
    assert worst[2.0] > 1.6 >= worst[1.6]  # the bound binds: at 1.6 the choice changed
    # the written plans, co-simulated again from their files, give what the summary says
    out = tmp_path / "co"
    written, summary = write_co_plan(result, out, profile_a=a_path, profile_b=b_path, cluster=cluster_path)
    assert [p.name for p in written] == ["plan-a.yaml", "plan-b.yaml", "summary.yaml"]
    jobs = load_jobs([out / "plan-a.yaml", out / "plan-b.yaml"])
    again = simulate_together(jobs, policy=summary["chosen"].get("policy") or "first-come", iterations=4)
    for j, written_job in zip(again.jobs, summary["chosen"]["jobs"].values(), strict=True):
        assert j.co_iteration_s == pytest.approx(written_job["iteration_s"], rel=1e-6)
        assert j.co_iteration_s <= 1.6 * summary["jobs"][j.label]["solo_iteration_s"] * (1 + 1e-9)
        assert written_job["slowdown"] <= 1.6
    # crossover, where chosen, is marked as a what-if the runtime does not run
    if summary["chosen"].get("policy") == "crossover":
        assert summary["chosen"]["runs"].startswith("simulated only: hetplan launch A B runs first-come")
    # by default only what `hetplan launch A B` runs is tried: first-come, never crossover
    assert CoPlanOptions(batch_a=1, batch_b=1).policies == RUNTIME_POLICIES == ("first-come",)
    default = choose(pools, replace(opts, fairness=2.0, policies=RUNTIME_POLICIES))
    assert default.chosen.policy in ("first-come", "")
    # ties go to a policy the runtime runs: with both tried, first-come is simulated first
    both_orders = [choose(pools, replace(opts, fairness=2.0, policies=p)) for p in (POLICIES, POLICIES[::-1])]
    assert both_orders[0].chosen.policy == both_orders[1].chosen.policy
    with pytest.raises(HetplanError, match=r"no pair of plans keeps both jobs within 1\.3x") as err:
        choose(pools, replace(opts, fairness=1.3))
    assert err.value.field == "--fairness"


def test_co_plan_is_deterministic_and_writes_plan_files(tmp_path: Path, capsys) -> None:
    cluster_path = _cluster_file(tmp_path, per_node=1)
    a_path, b_path = _profile_files(tmp_path)
    opts = CoPlanOptions(batch_a=16, batch_b=8, **SMALL)
    first, second = tmp_path / "one", tmp_path / "two"
    co_plan_files(a_path, b_path, cluster_path, opts, first)
    co_plan_files(a_path, b_path, cluster_path, opts, second)
    for name in ("plan-a.yaml", "plan-b.yaml", "summary.yaml"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    plan = load_plan(first / "plan-a.yaml")
    assert plan.global_batch == 16 and plan.details["co_plan"]["with"] == "plan-b.yaml"
    assert load_plan(first / "plan-b.yaml").global_batch == 8
    for argv in (
        ["simulate", str(first / "plan-a.yaml")],
        ["show", str(first / "plan-b.yaml")],
        ["simulate", str(first / "plan-a.yaml"), str(first / "plan-b.yaml"), "--together", "--json"],
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(argv)
        out, err = capsys.readouterr()
        assert (exc.value.code or 0, err) == (0, ""), argv
    assert json.loads(out)["jobs"][1]["global_batch"] == 8


def test_cli_co_plan_prints_the_three_arrangements(tmp_path: Path, capsys) -> None:
    cluster_path = _cluster_file(tmp_path, per_node=1)
    a_path, _ = _profile_files(tmp_path)
    argv = ["co-plan", str(a_path), str(a_path), str(cluster_path), "--batch-a", "8", "--batch-b", "8"]
    argv += ["--policy", "first-come", "--iterations", "3", "-o", str(tmp_path / "co")]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    assert (exc.value.code or 0, err) == (0, "")
    for text in ("co-plan:", "one after the other", "split devices", "2x its solo plan", "wrote"):
        assert text in out
    summary = yaml.safe_load((tmp_path / "co" / "summary.yaml").read_text())
    assert summary["fairness"] == 2.0 and summary["search"]["policies"] == ["first-come"]


def test_co_plan_bad_input_is_one_line(tmp_path: Path, capsys) -> None:
    cluster_path = _cluster_file(tmp_path)
    a_path, _ = _profile_files(tmp_path)
    base = ["co-plan", str(a_path), str(a_path), str(cluster_path), "--batch-a", "8", "--batch-b", "8"]
    cases = [
        ([*base, "--fairness", "0.5", "-o", str(tmp_path / "x")], "--fairness"),
        (["co-plan", str(tmp_path / "missing.yaml"), *base[2:], "-o", str(tmp_path / "x")], "missing.yaml"),
        ([*base[:-2], "-o", str(tmp_path / "x")], "--batch-b"),
    ]
    for argv, expected in cases:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(argv)
        _, err = capsys.readouterr()
        assert exc.value.code == 2, argv
        assert err.count("\n") == 1 and expected in err and "Traceback" not in err
    with pytest.raises(HetplanError, match=r"at least 1\.0") as err:
        co_plan(None, None, None, CoPlanOptions(batch_a=1, batch_b=1, fairness=0.9))  # type: ignore[arg-type]
    assert err.value.field == "--fairness"


def test_a_crossover_choice_is_marked_simulated_only() -> None:
    """crossover is a what-if the runtime does not run: where chosen, the summary says so; first-come
    (what `hetplan launch A B` runs) carries no such mark."""
    from types import SimpleNamespace

    from hetplan.solve.coplan import Arrangement, _arrangement_summary

    cand = SimpleNamespace(label="whole cluster: plan", prepared=SimpleNamespace(devices=("n0/0",)))
    for policy, marked in (("crossover", True), ("first-come", False)):
        arr = Arrangement("1 GPUs shared", policy, (cand, cand), (2.0, 3.0), 10.0)
        out = _arrangement_summary(arr, (1.0, 1.5), None)
        assert ("runs" in out) == marked, policy
        if marked:
            assert out["runs"] == "simulated only: hetplan launch A B runs first-come (docs/co-scheduling.md)"

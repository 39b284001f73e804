"""The planner end to end: determinism, baselines, idle devices, infeasible inputs, the CLI."""

from __future__ import annotations

import pytest
from builders import make_cluster, make_profile

from hetplan.cli import main
from hetplan.contracts.plan import load_plan, load_plan_inputs
from hetplan.errors import HetplanError
from hetplan.simulate import simulate
from hetplan.solve import PlanOptions, plan_training
from hetplan.solve.baselines import BASELINES

A100, V100, T4 = "A100-80GB", "V100-16GB", "T4"


def _mixed():
    profile = make_profile(
        12,
        per_block={A100: [(1.0, 2.0)] * 12, V100: [(2.0, 4.0)] * 12, T4: [(6.0, 12.0)] * 12},
        params=1_000_000,
        output_bytes=1e6,
        activation_bytes=1e6,
    )
    cluster = make_cluster([("n0", [(A100, 2)]), ("n1", [(V100, 2), (T4, 1)])], inter="10GB/s")
    return profile, cluster


def test_plan_is_deterministic_and_at_least_as_fast_as_every_baseline() -> None:
    profile, cluster = _mixed()
    first = plan_training(profile, cluster, PlanOptions(global_batch=32))
    second = plan_training(profile, cluster, PlanOptions(global_batch=32))
    assert first.plan.to_dict() == second.plan.to_dict()
    assert set(first.baselines) == set(BASELINES)
    for name, baseline in first.baselines.items():
        if baseline is not None:
            assert first.sim.iteration_s <= baseline.sim.iteration_s * (1 + 1e-9), name
    assert first.lower_bound_s <= first.sim.iteration_s


def test_a_device_that_would_slow_the_iteration_is_left_idle() -> None:
    # one T4 ten times slower than the A100s, behind a slow link: using it can only hurt
    profile = make_profile(8, per_block={A100: [(1.0, 2.0)] * 8, T4: [(10.0, 20.0)] * 8}, output_bytes=1e9)
    cluster = make_cluster([("n0", [(A100, 2)]), ("n1", [(T4, 1)])], inter="1GB/s")
    result = plan_training(profile, cluster, PlanOptions(global_batch=4, optimizer="sgd"))
    assert "n1/0" not in result.plan.all_devices()


def test_a_model_that_cannot_fit_says_what_would_make_it_fit() -> None:
    profile = make_profile(2, times={T4: (1.0, 1.0)}, params=4_000_000_000)
    cluster = make_cluster([("n0", [(T4, 2)])])
    with pytest.raises(HetplanError, match=r"no plan fits in memory.*more devices"):
        plan_training(profile, cluster, PlanOptions(global_batch=8))


def test_the_chosen_plan_is_scored_by_the_simulator() -> None:
    profile, cluster = _mixed()
    result = plan_training(profile, cluster, PlanOptions(global_batch=16, schedule="gpipe"))
    assert simulate(result.plan, profile, cluster).iteration_s == result.sim.iteration_s


def test_cli_plan_show_compare_simulate(tmp_path, capsys) -> None:
    profile = tmp_path / "gpt.yaml"
    for args in (
        [
            "profile",
            "gpt",
            "--layers",
            "4",
            "--hidden",
            "512",
            "--heads",
            "8",
            "--seq",
            "128",
            "--analytic",
            "--devices",
            "A100-80GB,V100-16GB,T4",
            "-o",
            str(profile),
        ],
        ["plan", str(profile), "profiles/clusters/mixed-small.yaml", "--batch", "32", "-o", str(tmp_path / "p.yaml")],
        ["plan", str(profile), "profiles/clusters/mixed-small.yaml", "--batch", "32", "-o", str(tmp_path / "q.yaml")],
        ["show", str(tmp_path / "p.yaml")],
        ["compare", str(tmp_path / "p.yaml")],
        ["simulate", str(tmp_path / "p.yaml"), "--timeline", str(tmp_path / "t.svg")],
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(args)
        assert exit_info.value.code == 0, capsys.readouterr().err
    assert (tmp_path / "p.yaml").read_bytes() == (tmp_path / "q.yaml").read_bytes()
    out = capsys.readouterr().out
    assert "Plan vs baselines" in out and "uniform" in out and "lower bound" in out
    plan = load_plan(tmp_path / "p.yaml")
    loaded_profile, loaded_cluster = load_plan_inputs(plan)
    assert simulate(plan, loaded_profile, loaded_cluster).iteration_s == pytest.approx(plan.predicted["iteration_s"])


def test_cli_infeasible_batch_is_one_line(tmp_path, capsys) -> None:
    profile = tmp_path / "big.yaml"
    with pytest.raises(SystemExit):
        main(
            [
                "profile",
                "gpt",
                "--layers",
                "48",
                "--hidden",
                "8192",
                "--heads",
                "64",
                "--seq",
                "2048",
                "--analytic",
                "--devices",
                "T4",
                "-o",
                str(profile),
            ]
        )
    capsys.readouterr()
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "schema: hetplan/cluster/v1\nname: t4s\nnodes:\n  - name: n0\n    devices: [{type: T4, count: 2}]\n"
        "    link: {bandwidth: 16GB/s}\nnetwork: {bandwidth: 10Gbps}\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["plan", str(profile), str(cluster), "--batch", "8", "-o", str(tmp_path / "p.yaml")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no plan fits" in err and "more devices" in err


def test_the_lower_bound_holds_when_each_type_is_fastest_on_different_blocks() -> None:
    # A100 is 10x faster on blocks 0-1, V100 10x faster on blocks 2-3: a pipeline puts each block on
    # its fast type, which a whole-model-per-device bound would wrongly exclude
    fast, slow = (0.01, 0.02), (0.1, 0.2)
    profile = make_profile(4, per_block={A100: [fast, fast, slow, slow], V100: [slow, slow, fast, fast]})
    cluster = make_cluster([("n0", [(A100, 1), (V100, 1)])])
    result = plan_training(profile, cluster, PlanOptions(global_batch=64, optimizer="sgd"))
    assert result.lower_bound_s <= result.sim.iteration_s
    # every block on its fast type (0.03 s a sample), the work shared by both devices
    assert result.lower_bound_s == pytest.approx(64 * 4 * 0.03 / 2)

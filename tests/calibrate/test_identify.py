"""What the data cannot tell stays at its prior; leave-one-out errors mean what they say."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from builders import make_profile
from calib_synth import CLUSTER, TRUTH, write_case

from hetplan.calibrate import calibrate_files
from hetplan.contracts import Pipeline, Plan, Stage, load_cluster, load_profile
from hetplan.contracts.paths import bundled_profiles_dir
from hetplan.contracts.yamlio import write_yaml
from hetplan.simulate import simulate


def _fitted(result) -> dict[str, object]:
    return {p.name: p for p in result.params}


def test_parameters_no_measured_plan_uses_stay_at_their_prior(tmp_path: Path) -> None:
    # only node n0 is measured: V100 compute, node n1's link and the network are never used
    files = write_case(tmp_path / "in", TRUTH, names=["pipe-n0", "dp-n0"])
    result, (profile_path, cluster_path) = calibrate_files(*files, tmp_path / "out")
    fitted = _fitted(result)
    for name in (
        "compute[V100-16GB]",
        "bandwidth[node n1]",
        "latency[node n1]",
        "bandwidth[network]",
        "latency[network]",
    ):
        assert not fitted[name].identified, name
        assert fitted[name].reason == "not used by any measured plan", name
        assert fitted[name].value == fitted[name].prior, name
    assert fitted["compute[A100-80GB]"].identified
    assert fitted["compute[A100-80GB]"].value == pytest.approx(1.7, rel=0.02)
    # and the files say so: the cluster's untouched figures are the user's own strings
    written = yaml.safe_load(cluster_path.read_text())
    assert written["network"] == CLUSTER["network"]
    assert written["nodes"][1]["link"] == CLUSTER["nodes"][1]["link"]
    original, calibrated = load_profile(files[0]), load_profile(profile_path)
    for before, after in zip(original.blocks, calibrated.blocks, strict=True):
        assert after.times["V100-16GB"] == before.times["V100-16GB"]
        assert after.times["A100-80GB"][1].source == "calibrated"
        assert after.times["A100-80GB"][1].fwd == pytest.approx(before.times["A100-80GB"][1].fwd * 1.7, rel=0.02)


def test_a_latency_the_measurements_cannot_see_is_not_fitted_to_noise(tmp_path: Path) -> None:
    # 5 us on transfers of 100 MB: no measured time moves with it
    files = write_case(tmp_path / "in", TRUTH)
    result, _ = calibrate_files(*files, tmp_path / "out")
    latency = _fitted(result)["latency[network]"]
    assert latency.reason != "not used by any measured plan"  # the plans do cross the network ...
    assert not latency.identified  # ... but cannot tell its latency
    assert latency.resolution is not None and latency.resolution < 0.9
    assert latency.value == latency.prior


def test_single_node_cluster_network_is_not_identified(tmp_path: Path) -> None:
    """The bundled local-2 (one node, an emulated fast and slow CPU): its network is never used."""
    cluster = bundled_profiles_dir() / "clusters" / "local-2.yaml"
    profile = make_profile(4, times={"cpu": (0.01, 0.02)}, output_bytes=1e5)
    profile.save(tmp_path / "profile.yaml")
    plan = Plan(
        global_batch=4,
        pipelines=[Pipeline(4, (2, 2), (Stage(0, 2, ("local/0",), (1.0,)), Stage(2, 4, ("local/1",), (1.0,))))],
        inputs={"profile": {"path": "profile.yaml"}, "cluster": {"path": str(cluster)}},
    )
    plan.save(tmp_path / "plan.yaml")
    measured = simulate(plan, profile, load_cluster(cluster)).iteration_s * 1.25
    write_yaml(
        {"schema": "hetplan/measurements/v1", "runs": [{"plan": "plan.yaml", "iteration_s": measured}]},
        tmp_path / "m.yaml",
    )
    result, _ = calibrate_files(tmp_path / "profile.yaml", cluster, tmp_path / "m.yaml", tmp_path / "out")
    fitted = _fitted(result)
    assert fitted["bandwidth[network]"].reason == "not used by any measured plan"
    assert fitted["collective_efficiency"].reason == "not used by any measured plan"  # no data parallelism
    # one iteration time cannot split the slowdown between the two emulated types and the link:
    # whatever is identified explains the run, and nothing swings far to do it
    assert abs(result.runs[0].residual) < 0.01
    assert all(0.5 < p.value / p.prior < 2.0 for p in result.params if p.prior > 0)
    assert result.runs[0].loo is None  # one run: nothing to leave out


def test_leave_one_out_error_shows_what_only_that_run_could_tell(tmp_path: Path) -> None:
    # pipe-cross is the only run that crosses the network; the others each repeat what another shows
    files = write_case(tmp_path / "in", TRUTH, names=["pipe-cross", "pipe-n0", "pipe-n1", "dp-n0"])
    result, _ = calibrate_files(*files, tmp_path / "out")
    runs = {r.name: r for r in result.runs}
    assert _fitted(result)["bandwidth[network]"].identified
    cross = runs["pipe-cross.jsonl"]
    assert abs(cross.residual) < 0.005
    # left out, the network falls back to its 10 GB/s prior: pipe-cross is predicted too fast
    assert cross.loo_error is not None and cross.loo_error < -0.02
    for name in ("pipe-n0.jsonl", "pipe-n1.jsonl", "dp-n0.jsonl"):
        assert runs[name].loo_error is not None and abs(runs[name].loo_error) < 0.01, name


def test_calibrated_files_reload_reproduce_the_fit_and_are_byte_identical(tmp_path: Path) -> None:
    files = write_case(tmp_path / "in", TRUTH, names=["pipe-cross", "dp-cross", "pipe-n0"])
    first, (profile_a, cluster_a) = calibrate_files(*files, tmp_path / "a")
    _, (profile_b, cluster_b) = calibrate_files(*files, tmp_path / "b")
    assert profile_a.read_bytes() == profile_b.read_bytes()
    assert cluster_a.read_bytes() == cluster_b.read_bytes()
    profile, cluster = load_profile(profile_a), load_cluster(cluster_a)
    assert cluster.calibrated["inputs"]["measurements"]["file"] == "measured.yaml"
    assert profile.source["calibrated"]["runs"][0]["name"] == "pipe-cross.jsonl"
    from hetplan.contracts import load_plan

    for run, name in zip(first.runs, ["pipe-cross", "pipe-n0", "dp-cross"], strict=True):  # file order
        again = simulate(load_plan(tmp_path / "in" / f"{name}.yaml"), profile, cluster).iteration_s
        assert again == pytest.approx(run.after, rel=1e-12), name

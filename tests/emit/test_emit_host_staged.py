"""A cluster whose nodes say ``host_staged`` is emitted to run that way: gloo, ranks on the GPU."""

from __future__ import annotations

import copy

import yaml
from builders import linear_plan, make_profile

from hetplan.contracts.cluster import parse_cluster
from hetplan.emit import emit_launch

A100 = "A100-80GB"
RAW = {
    "schema": "hetplan/cluster/v1",
    "name": "staged",
    "nodes": [{"name": "n0", "devices": [{"type": A100, "count": 2}], "link": {"bandwidth": "100GB/s"}}],
    "network": {"bandwidth": "10GB/s"},
}


def _emit(tmp_path, staged: bool) -> dict:
    raw = copy.deepcopy(RAW)
    if staged:
        raw["nodes"][0]["host_staged"] = {"bandwidth": "25GB/s"}
    cluster = parse_cluster(raw, file="c.yaml")
    profile = make_profile(2, times={A100: (0.01, 0.02)})
    plan = linear_plan(["n0/0", "n0/1"], 2, [1], optimizer="sgd")
    out = tmp_path / ("staged" if staged else "direct")
    emit_launch(plan, profile, cluster, out, master="node0:29500")
    return yaml.safe_load((out / "rank-config.yaml").read_text())["training"]


def test_a_host_staged_node_emits_gloo_with_ranks_on_the_gpu(tmp_path) -> None:
    training = _emit(tmp_path, staged=True)
    assert training["backend"] == "gloo" and training["compute_device"] == "cuda"
    direct = _emit(tmp_path, staged=False)
    assert direct["backend"] == "nccl" and direct.get("compute_device") in (None, "cuda")


def test_emit_passes_init_from_to_the_rank_config(tmp_path, capsys) -> None:
    from builders import run_cli

    from hetplan.contracts.yamlio import write_yaml

    profile = make_profile(2, times={A100: (0.01, 0.02)})
    profile.model = {"family": "mlp", "config": {"layers": 2}}
    profile.save(tmp_path / "profile.yaml")
    write_yaml(RAW, tmp_path / "cluster.yaml")
    plan = linear_plan(["n0/0", "n0/1"], 2, [1], optimizer="sgd")
    plan.inputs = {"profile": {"path": "profile.yaml"}, "cluster": {"path": "cluster.yaml"}}
    plan.save(tmp_path / "plan.yaml")
    out = tmp_path / "launch"
    code, _, err = run_cli(["emit", str(tmp_path / "plan.yaml"), "-o", str(out), "--init-from", "weights/"], capsys)
    assert code == 0, err
    assert yaml.safe_load((out / "rank-config.yaml").read_text())["training"]["init_from"] == "weights/"

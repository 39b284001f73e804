"""The command line as a user meets it: listing, validating, showing, help and version."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
import yaml
from builders import run_cli as run

import hetplan.cli as cli
from hetplan import __version__
from hetplan.contracts import load_catalog, load_cluster
from hetplan.contracts.paths import bundled_profiles_dir

PROFILES = bundled_profiles_dir()
CLUSTER_FILES = sorted((PROFILES / "clusters").glob("*.yaml"))


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as on a wide terminal, so no name is cut short with an ellipsis."""
    monkeypatch.setattr(cli.console, "_width", 250)


def test_devices_lists_every_catalog_type(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["devices"], capsys)
    assert (code, err) == (0, "")
    catalog = load_catalog()
    for device in catalog:
        assert device.name in out, device.name
    assert f"Device catalog ({len(catalog)} types)" in out


def test_devices_json_parses(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["devices", "--json"], capsys)
    assert (code, err) == (0, "")
    data = json.loads(out)
    catalog = load_catalog()
    assert set(data["devices"]) == {d.name for d in catalog}
    a100 = data["devices"]["A100-80GB"]
    assert a100["memory_bytes"] == 80 * 2**30
    assert a100["peak_tflops"]["bf16"] == pytest.approx(312)
    assert "A100-80" in a100["aliases"]


def test_validate_bundled_files(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(PROFILES / "devices.yaml"), *map(str, CLUSTER_FILES)]
    code, out, err = run(["validate", *files], capsys)
    assert (code, err) == (0, "")
    assert out.count("ok ") == len(files)
    assert "(catalog)" in out and "(cluster)" in out


@pytest.mark.parametrize("path", CLUSTER_FILES, ids=lambda p: p.name)
def test_show_cluster(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["show", str(path)], capsys)
    assert (code, err) == (0, "")
    cluster = load_cluster(path)
    assert f"Cluster {cluster.name}" in out
    for node in cluster.nodes[:3]:
        assert node.name in out
    for name in cluster.device_types:
        assert name in out
    if cluster.emulated:
        assert "EMULATED" in out


def test_show_cluster_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["show", "--json", str(PROFILES / "clusters" / "mixed-small.yaml")], capsys)
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert data["kind"] == "cluster"
    assert data["devices"] == 6
    assert [d["address"] for d in data["nodes"][1]["devices"]] == ["node1/0", "node1/1", "node1/2", "node1/3"]


def test_show_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = [
        {
            "name": name,
            "kind": kind,
            "params": 1000 * (i + 1),
            "activation_bytes": 4096,
            "output_bytes": 1024,
            "time": {"A100-80GB": {1: {"fwd": 0.001, "bwd": 0.002}}, "T4": {1: {"fwd": 0.004, "bwd": 0.008}}},
        }
        for i, (name, kind) in enumerate([("embed", "embedding"), ("layer0.attn", "attention"), ("head", "head")])
    ]
    data = {"schema": "hetplan/model-profile/v1", "model": {"family": "gpt"}, "dtype": "fp16", "blocks": blocks}
    path = tmp_path / "gpt.profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    code, out, err = run(["show", str(path)], capsys)
    assert (code, err) == (0, "")
    for text in ("Model profile gpt (fp16, 3 blocks)", "embed", "layer0.attn", "attention", "head", "A100-80GB", "T4"):
        assert text in out, text
    assert "6,000" in out  # total parameters


def test_profile_then_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "gpt.yaml"
    argv = ["profile", "gpt", "--analytic", "--devices", "A100-80GB,T4", "--micro-batches", "1,4", "-o", str(out_file)]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert f"wrote {out_file}" in out
    code, out, err = run(["show", str(out_file)], capsys)
    assert (code, err) == (0, "")
    assert "A100-80GB" in out and "T4" in out


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for name, command in sorted(group.commands.items()):
        out.append((*prefix, name))
        if isinstance(command, click.Group):
            out.extend(_commands(command, (*prefix, name)))
    return out


COMMANDS = _commands(cli.cli)


def test_the_documented_commands_exist() -> None:
    for name in ("devices", "profile", "import", "validate", "show", "simulate", "demo"):
        assert (name,) in COMMANDS


@pytest.mark.parametrize("command", [(), *COMMANDS], ids=lambda c: " ".join(c) or "hetplan")
def test_help_has_an_example(command: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*command, "--help"], capsys)
    assert (code, err) == (0, "")
    assert "Example" in out
    assert "Usage: hetplan" in out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["--version"], capsys)
    assert (code, err) == (0, "")
    assert out.strip() == f"hetplan, version {__version__}"


def test_bf16_on_a_gpu_without_bf16_is_refused_by_plan_and_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tmp_path / "p.yaml"
    cluster = str(bundled_profiles_dir() / "clusters" / "a100-40-v100.yaml")
    code, _, err = run(
        [
            "profile", "gpt", "--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "16",
            "--analytic", "--devices", "A100-40GB,V100-16GB", "--dtype", "bf16", "-o", str(profile),
        ],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    code, _, err = run(["plan", str(profile), cluster, "--batch", "16", "-o", str(tmp_path / "plan.yaml")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "a100-40-v100.yaml" in err and "V100-16GB" in err and "cannot run bf16" in err
    # a hand-written bf16 plan that puts a stage on a V100 is refused by validate, naming the field
    plan = {
        "schema": "hetplan/plan/v1",
        "inputs": {"profile": {"path": str(profile)}, "cluster": {"path": cluster}},
        "global_batch": 4,
        "pipelines": [{"batch": 4, "micro_batches": [4], "stages": [{"blocks": [0, 6], "devices": ["node1/0"]}]}],
    }
    (tmp_path / "hand.yaml").write_text(yaml.safe_dump(plan))
    code, _, err = run(["validate", str(tmp_path / "hand.yaml")], capsys)
    assert code == 2 and "hand.yaml: dtype:" in err and "node1/0 is a V100-16GB" in err


def test_compare_puts_other_plans_of_the_same_inputs_beside_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = str(bundled_profiles_dir() / "clusters" / "local-2.yaml")
    for name, layers in (("p.yaml", "4"), ("q.yaml", "6")):
        code, _, err = run(
            ["profile", "gpt", "--layers", layers, "--hidden", "64", "--heads", "2", "--seq", "16", "--analytic",
             "--devices", "cpu", "-o", str(tmp_path / name)],
            capsys,
        )  # fmt: skip
        assert code == 0, err
        code, _, err = run(
            ["plan", str(tmp_path / name), cluster, "--batch", "16", "-o", str(tmp_path / f"plan-{name}")], capsys
        )
        assert code == 0, err
    code, _, err = run(["export", "megatron", str(tmp_path / "plan-p.yaml"), "-o", str(tmp_path / "meg")], capsys)
    assert code == 0, err
    code, out, err = run(
        ["compare", str(tmp_path / "plan-p.yaml"), "--with", str(tmp_path / "meg" / "exported-plan.yaml"), "--json"],
        capsys,
    )
    assert code == 0, err
    rows = json.loads(out)
    assert rows[0]["name"] == "hetplan" and rows[-1]["name"] == "megatron export (meg)"  # an export: its runtime
    assert rows[-1]["iteration_s"] >= rows[0]["iteration_s"] * 0.999  # on this instance the export is no faster
    # a plan of another profile is refused, naming the field
    code, _, err = run(["compare", str(tmp_path / "plan-p.yaml"), "--with", str(tmp_path / "plan-q.yaml")], capsys)
    assert code == 2 and "plan-q.yaml: inputs.profile.sha256" in err

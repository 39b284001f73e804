"""Every bad input a user can make ends in ONE line on stderr and exit code 2, through the real CLI.

Each case writes a small valid baseline (built here as a dict, dumped with yaml) into tmp_path,
breaks one thing, runs ``cli.main([...])`` and checks the line: it starts with ``error: ``, names
the file, names the field path where there is one, says what was expected, and has no traceback.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import run_cli

# --------------------------------------------------------------------------- valid baselines


def cluster_data() -> dict[str, Any]:
    return {
        "schema": "hetplan/cluster/v1",
        "name": "tiny",
        "description": "two nodes, two types",
        "nodes": [
            {
                "name": "node0",
                "devices": [{"type": "A100-80GB", "count": 2}],
                "link": {"bandwidth": "600GB/s", "latency": "2us"},
            },
            {
                "name": "node1",
                "devices": [{"type": "V100-16GB", "count": 2}],
                "link": {"bandwidth": "300GB/s", "latency": "2us"},
            },
        ],
        "network": {"bandwidth": "100Gbps", "latency": "10us"},
    }


def profile_data(n_blocks: int = 4) -> dict[str, Any]:
    blocks = []
    for i in range(n_blocks):
        blocks.append(
            {
                "name": f"b{i}",
                "kind": "mlp",
                "params": 1000,
                "activation_bytes": 4096,
                "output_bytes": 1024,
                "flops_fwd": 1.0e6,
                "time": {
                    "A100-80GB": {1: {"fwd": 0.001, "bwd": 0.002, "source": "estimated"}},
                    "V100-16GB": {1: {"fwd": 0.002, "bwd": 0.004, "source": "estimated"}},
                },
            }
        )
    return {
        "schema": "hetplan/model-profile/v1",
        "model": {"name": "tiny", "config": {"layers": n_blocks}},
        "dtype": "fp32",
        "blocks": blocks,
    }


def catalog_data() -> dict[str, Any]:
    return {
        "schema": "hetplan/devices/v1",
        "devices": {
            "GPU-A": {"memory": "16GiB", "memory_bandwidth": "900GB/s", "tflops": {"fp32": 15.7}, "aliases": ["A"]},
            "GPU-B": {"memory": "24GiB", "memory_bandwidth": "600GB/s", "tflops": {"fp32": 31.2, "fp16": 125}},
        },
    }


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plan_data(folder: Path) -> dict[str, Any]:
    """A plan for profile_data() on cluster_data(), written beside it as profile.yaml / cluster.yaml."""
    profile = dump(profile_data(), folder / "profile.yaml")
    cluster = dump(cluster_data(), folder / "cluster.yaml")
    return {
        "schema": "hetplan/plan/v1",
        "inputs": {
            "profile": {"path": "profile.yaml", "sha256": sha256(profile)},
            "cluster": {"path": "cluster.yaml", "sha256": sha256(cluster)},
        },
        "global_batch": 8,
        "schedule": "1f1b",
        "pipelines": [
            {
                "batch": 4,
                "micro_batches": [2, 2],
                "stages": [
                    {"blocks": [0, 2], "devices": ["node0/0"]},
                    {"blocks": [2, 4], "devices": ["node0/1"]},
                ],
            },
            {
                "batch": 4,
                "micro_batches": [4],
                "stages": [{"blocks": [0, 4], "devices": ["node1/0", "node1/1"], "shares": [0.5, 0.5]}],
            },
        ],
    }


def run_record(step: int = 0) -> dict[str, Any]:
    return {
        "schema": "hetplan/run-log/v1",
        "step": step,
        "rank": 0,
        "pipeline": 0,
        "stage": 0,
        "device": "node0/0",
        "iteration_s": 1.0,
        "compute_s": 0.6,
        "wait_s": 0.2,
        "comm_s": 0.2,
        "loss": 2.5,
        "peak_memory_bytes": 1.0e9,
    }


def dump(data: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- running the CLI


def assert_one_line_error(err: str, *, file: str | None, field: str | None, expect: tuple[str, ...]) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{err}"
    line = lines[0]
    assert line.startswith("error: "), line
    if file is not None:
        assert line.startswith(f"error: {file}: "), f"file {file} not named first: {line}"
    if field is not None:
        assert f": {field}: " in line, f"field {field} not named: {line}"
    for text in expect:
        assert text in line, f"{text!r} not in: {line}"
    return line


# --------------------------------------------------------------------------- the cases


@dataclass
class Case:
    argv: list[str]
    file: str | None  # the path the line must start with (None: a CLI argument error)
    field: str | None  # the field path the line must name, where there is one
    expect: tuple[str, ...]  # what was expected, in the user's words


CASES: dict[str, Callable[[Path], Case]] = {}


def case(name: str) -> Callable[[Callable[[Path], Case]], Callable[[Path], Case]]:
    def register(build: Callable[[Path], Case]) -> Callable[[Path], Case]:
        assert name not in CASES, name
        CASES[name] = build
        return build

    return register


def cluster_case(
    tmp: Path, mutate: Callable[[dict], Any], field: str | None, *expect: str, cmd: str = "validate"
) -> Case:
    data = cluster_data()
    mutate(data)
    path = dump(data, tmp / "cluster.yaml")
    return Case([cmd, str(path)], str(path), field, expect)


def profile_case(tmp: Path, mutate: Callable[[dict], Any], field: str | None, *expect: str) -> Case:
    data = profile_data()
    mutate(data)
    path = dump(data, tmp / "gpt.profile.yaml")
    return Case(["validate", str(path)], str(path), field, expect)


def catalog_case(tmp: Path, mutate: Callable[[dict], Any], field: str | None, *expect: str) -> Case:
    data = catalog_data()
    mutate(data)
    path = dump(data, tmp / "devices.yaml")
    return Case(["validate", str(path)], str(path), field, expect)


def plan_case(tmp: Path, mutate: Callable[[dict], Any], field: str | None, *expect: str, cmd: str = "validate") -> Case:
    data = plan_data(tmp)
    mutate(data)
    path = dump(data, tmp / "plan.yaml")
    return Case([cmd, str(path)], str(path), field, expect)


def raw_case(tmp: Path, content: bytes, *expect: str, name: str = "bad.yaml", cmd: str = "validate") -> Case:
    path = tmp / name
    path.write_bytes(content)
    return Case([cmd, str(path)], str(path), None, expect)


def _key(container: Any, part: str) -> Any:
    """A dotted-path part as the key it is: a list index, or a mapping key (micro-batch keys are ints)."""
    if isinstance(container, list) or (part.isdigit() and part not in container):
        return int(part)
    return part


def _parent(data: dict, path: str) -> tuple[Any, Any]:
    *parents, last = path.split(".")
    target: Any = data
    for part in parents:
        target = target[_key(target, part)]
    return target, _key(target, last)


def setter(path: str, value: Any) -> Callable[[dict], None]:
    """``setter("nodes.1.devices.0.type", "X")`` sets that place in a nested dict/list."""

    def apply(data: dict) -> None:
        target, key = _parent(data, path)
        target[key] = value

    return apply


def deleter(path: str) -> Callable[[dict], None]:
    def apply(data: dict) -> None:
        target, key = _parent(data, path)
        del target[key]

    return apply


# -- any file: reading and parsing -------------------------------------------------------


@case("nonexistent-file")
def _(tmp: Path) -> Case:
    path = tmp / "nope.yaml"
    return Case(["validate", str(path)], str(path), None, ("file not found",))


@case("directory-instead-of-file")
def _(tmp: Path) -> Case:
    folder = tmp / "clusters"
    folder.mkdir()
    return Case(["show", str(folder)], str(folder), None, ("is a directory", "expected a YAML file"))


@case("empty-file")
def _(tmp: Path) -> Case:
    return raw_case(tmp, b"", "empty file", "schema:")


@case("whitespace-only-file")
def _(tmp: Path) -> Case:
    return raw_case(tmp, b"  \n\t\n   \n", "empty file", "schema:")


@case("comments-only-file")
def _(tmp: Path) -> Case:
    return raw_case(tmp, b"# nothing here yet\n", "expected a YAML mapping at the top level, got nothing")


@case("binary-garbage")
def _(tmp: Path) -> Case:
    garbage = bytes(random.Random(7).randrange(256) for _ in range(512)) + b"\x00\x00"
    return raw_case(tmp, garbage, "not a text file", "expected YAML", name="cluster.yaml")


@case("nul-bytes-in-utf8-text")
def _(tmp: Path) -> Case:
    return raw_case(tmp, b"schema: hetplan/cluster/v1\nname: a\x00b\n", "not a text file (NUL bytes)")


@case("invalid-utf8")
def _(tmp: Path) -> Case:
    return raw_case(tmp, b"schema: hetplan/cluster/v1\nname: caf\xe9\n", "invalid UTF-8", "expected YAML")


@case("top-level-list")
def _(tmp: Path) -> Case:
    return raw_case(tmp, b"- schema: hetplan/cluster/v1\n- name: x\n", "expected a YAML mapping at the top level")


@case("yaml-syntax-error")
def _(tmp: Path) -> Case:
    text = b"schema: hetplan/cluster/v1\nname: x\nnodes:\n  - name: [node0\n    devices: []\n"
    return raw_case(tmp, text, "YAML syntax error at line 5", cmd="show")


@case("yaml-tab-indent")
def _(tmp: Path) -> Case:
    text = b"schema: hetplan/cluster/v1\nname: x\nnetwork:\n\tbandwidth: 100Gbps\n"
    return raw_case(tmp, text, "YAML syntax error at line 4")


@case("duplicate-yaml-key")
def _(tmp: Path) -> Case:
    text = yaml.safe_dump(cluster_data(), sort_keys=False) + "name: again\n"
    return raw_case(tmp, text.encode(), "duplicate key 'name'", "(first at line 2)")


@case("impossible-date-value")
def _(tmp: Path) -> Case:
    text = yaml.safe_dump(cluster_data(), sort_keys=False).replace("name: tiny", "name: 2023-13-45")
    return raw_case(tmp, text.encode(), "line 2", "cannot read timestamp value '2023-13-45'")


@case("unknown-schema")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, setter("schema", "hetplan/topology/v1"), "schema", "unknown schema", "hetplan/cluster/v1")


@case("wrong-schema-version")
def _(tmp: Path) -> Case:
    return cluster_case(
        tmp, setter("schema", "hetplan/cluster/v2"), "schema", "unsupported schema version", "hetplan/cluster/v1"
    )


@case("missing-schema-line")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, deleter("schema"), "schema", "missing 'schema:' line")


# -- cluster ---------------------------------------------------------------------------


@case("unknown-device-type")
def _(tmp: Path) -> Case:
    return cluster_case(
        tmp,
        setter("nodes.1.devices.0.type", "V100-16G"),
        "nodes[1].devices[0].type",
        "unknown device type 'V100-16G'",
        "did you mean 'V100-16GB'?",
    )


@case("negative-bandwidth")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, setter("network.bandwidth", -100), "network.bandwidth", "expected a positive value")


@case("negative-bandwidth-with-unit")
def _(tmp: Path) -> Case:
    return cluster_case(
        tmp, setter("nodes.0.link.bandwidth", "-5GB/s"), "nodes[0].link.bandwidth", "expected a positive value"
    )


@case("zero-bandwidth")
def _(tmp: Path) -> Case:
    return cluster_case(
        tmp, setter("nodes.1.link.bandwidth", "0GB/s"), "nodes[1].link.bandwidth", "expected a positive value"
    )


@case("unit-typo")
def _(tmp: Path) -> Case:
    return cluster_case(
        tmp, setter("network.bandwidth", "100Gbsp"), "network.bandwidth", "expected a bandwidth such as", "100Gbps"
    )


@case("latency-without-number")
def _(tmp: Path) -> Case:
    return cluster_case(
        tmp, setter("nodes.0.link.latency", "fast"), "nodes[0].link.latency", "expected a duration such as '5us'"
    )


@case("overflowing-bandwidth")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, setter("network.bandwidth", "1e999GB/s"), "network.bandwidth", "finite")


@case("missing-field")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, deleter("nodes.1.name"), "nodes[1].name", "missing required field")


@case("missing-network")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, deleter("network"), "network", "missing required field")


@case("missing-link-of-multi-device-node")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, deleter("nodes.0.link"), "nodes[0].link", "missing required field")


@case("duplicate-node-name")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, setter("nodes.1.name", "node0"), "nodes[1].name", "duplicate node name 'node0'")


@case("unknown-field-typo")
def _(tmp: Path) -> Case:
    def typo(data: dict) -> None:
        data["network"]["latncy"] = data["network"].pop("latency")

    return cluster_case(tmp, typo, "network.latncy", "unknown field", "did you mean 'latency'?")


@case("count-zero")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, setter("nodes.0.devices.0.count", 0), "nodes[0].devices[0].count", "integer >= 1")


@case("count-two-as-word")
def _(tmp: Path) -> Case:
    return cluster_case(
        tmp, setter("nodes.0.devices.0.count", "two"), "nodes[0].devices[0].count", "expected an integer", "'two'"
    )


@case("count-absurd")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, setter("nodes.0.devices.0.count", 10**12), "nodes[0].devices[0].count", "<= 4096")


@case("node-name-with-slash")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, setter("nodes.0.name", "rack1/node0"), "nodes[0].name", "may not contain '/'")


@case("devices-not-a-list")
def _(tmp: Path) -> Case:
    return cluster_case(tmp, setter("nodes.0.devices", "A100-80GB x2"), "nodes[0].devices", "expected a list")


@case("override-unknown-node")
def _(tmp: Path) -> Case:
    override = [{"between": ["node0", "node9"], "bandwidth": "25Gbps"}]
    return cluster_case(
        tmp, setter("network.overrides", override), "network.overrides[0].between[1]", "unknown node 'node9'"
    )


@case("override-node-not-a-name")
def _(tmp: Path) -> Case:
    override = [{"between": [["node0"], "node1"], "bandwidth": "25Gbps"}]
    return cluster_case(
        tmp, setter("network.overrides", override), "network.overrides[0].between[0]", "expected a node name"
    )


@case("group-of-one-node")
def _(tmp: Path) -> Case:
    group = [{"name": "rack", "nodes": ["node0", "node0"], "bandwidth": "200Gbps"}]
    return cluster_case(tmp, setter("network.groups", group), "network.groups[0].nodes", "at least 2 distinct nodes")


@case("emulate-slowdown-below-one")
def _(tmp: Path) -> Case:
    entry = {"type": "fast-gpu", "count": 2, "emulate": {"base": "A100-80GB", "slowdown": 0.5}}
    return cluster_case(
        tmp, setter("nodes.0.devices.0", entry), "nodes[0].devices[0].emulate.slowdown", "expected a slowdown >= 1"
    )


@case("spec-and-emulate-both")
def _(tmp: Path) -> Case:
    spec = {"memory": "8GiB", "memory_bandwidth": "300GB/s", "tflops": {"fp32": 10}}
    entry = {"type": "odd-gpu", "count": 1, "spec": spec, "emulate": {"base": "A100-80GB", "slowdown": 2}}
    return cluster_case(tmp, setter("nodes.0.devices.0", entry), "nodes[0].devices[0].emulate", "either 'spec'")


@case("inline-spec-reusing-catalog-name")
def _(tmp: Path) -> Case:
    spec = {"memory": "8GiB", "memory_bandwidth": "300GB/s", "tflops": {"fp32": 10}}
    entry = {"type": "T4", "count": 1, "spec": spec}
    return cluster_case(tmp, setter("nodes.0.devices.0", entry), "nodes[0].devices[0].type", "is a catalog type")


# -- device catalog ----------------------------------------------------------------------


@case("catalog-unknown-dtype")
def _(tmp: Path) -> Case:
    return catalog_case(tmp, setter("devices.GPU-B.tflops.fp8", 250), "devices.GPU-B.tflops.fp8", "unknown dtype 'fp8'")


@case("catalog-negative-memory")
def _(tmp: Path) -> Case:
    return catalog_case(tmp, setter("devices.GPU-A.memory", -16), "devices.GPU-A.memory", "expected a positive value")


@case("catalog-alias-twice")
def _(tmp: Path) -> Case:
    return catalog_case(tmp, setter("devices.GPU-B.aliases", ["A"]), "devices.GPU-B.aliases", "alias 'A' is used twice")


# -- model profile -------------------------------------------------------------------------


@case("profile-block-missing-device-times")
def _(tmp: Path) -> Case:
    return profile_case(
        tmp, deleter("blocks.2.time.V100-16GB"), "blocks[2].time", "no times for ['V100-16GB']", "same device types"
    )


@case("profile-duplicate-block-name")
def _(tmp: Path) -> Case:
    return profile_case(tmp, setter("blocks.2.name", "b1"), "blocks[2].name", "duplicate block name 'b1'")


@case("profile-negative-activation-bytes")
def _(tmp: Path) -> Case:
    return profile_case(tmp, setter("blocks.1.activation_bytes", -1), "blocks[1].activation_bytes", ">= 0")


@case("profile-dtype-fp8")
def _(tmp: Path) -> Case:
    return profile_case(tmp, setter("dtype", "fp8"), "dtype", "expected one of fp32, tf32, fp16, bf16", "'fp8'")


@case("profile-micro-batch-zero")
def _(tmp: Path) -> Case:
    times = {0: {"fwd": 0.001, "bwd": 0.002}}
    return profile_case(
        tmp, setter("blocks.0.time.A100-80GB", times), "blocks[0].time.A100-80GB", "positive integers, got 0"
    )


@case("profile-unknown-time-source")
def _(tmp: Path) -> Case:
    return profile_case(
        tmp,
        setter("blocks.0.time.A100-80GB.1.source", "guessed"),
        "blocks[0].time.A100-80GB[1].source",
        "expected one of measured, estimated, imported",
    )


@case("profile-model-without-identity")
def _(tmp: Path) -> Case:
    return profile_case(tmp, setter("model", {"config": {}}), "model", "expected 'family'")


# -- plan --------------------------------------------------------------------------------


@case("plan-device-not-in-cluster")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp,
        setter("pipelines.0.stages.1.devices", ["node5/0"]),
        "pipelines[0].stages[1].devices[0]",
        "no device 'node5/0'",
        "NODE/INDEX",
        cmd="simulate",
    )


@case("plan-device-index-out-of-range")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp, setter("pipelines.0.stages.1.devices", ["node0/7"]), "pipelines[0].stages[1].devices[0]", "'node0/7'"
    )


@case("plan-device-without-slash")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp, setter("pipelines.0.stages.1.devices", ["node0"]), "pipelines[0].stages[1].devices[0]", "NODE/INDEX"
    )


@case("plan-block-gap")
def _(tmp: Path) -> Case:
    return plan_case(tmp, setter("pipelines.0.stages.1.blocks", [3, 4]), "pipelines[0].stages[1].blocks", "(a gap)")


@case("plan-block-overlap")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp, setter("pipelines.0.stages.1.blocks", [1, 4]), "pipelines[0].stages[1].blocks", "(an overlap)"
    )


@case("plan-first-stage-not-at-zero")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp, setter("pipelines.1.stages.0.blocks", [1, 4]), "pipelines[1].stages[0].blocks", "must start at block 0"
    )


@case("plan-last-stage-short-of-profile")
def _(tmp: Path) -> Case:
    def short(data: dict) -> None:
        data["pipelines"][0]["stages"][1]["blocks"] = [2, 3]
        data["pipelines"][1]["stages"][0]["blocks"] = [0, 3]

    return plan_case(tmp, short, "pipelines[0].stages[1].blocks", "ends at block 3", "profile has 4 blocks")


@case("plan-micro-batches-not-summing")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp, setter("pipelines.0.micro_batches", [2, 1]), "pipelines[0].micro_batches", "sum to 3", "batch 4"
    )


@case("plan-pipelines-not-summing-to-global-batch")
def _(tmp: Path) -> Case:
    return plan_case(tmp, setter("global_batch", 10), "pipelines", "sum to 8", "global_batch 10")


@case("plan-device-used-twice")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp,
        setter("pipelines.1.stages.0.devices", ["node1/0", "node0/0"]),
        "pipelines[1].stages[0].devices",
        "node0/0 is used twice",
    )


@case("plan-shares-not-summing")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp, setter("pipelines.1.stages.0.shares", [0.5, 0.6]), "pipelines[1].stages[0].shares", "must sum to 1"
    )


@case("plan-shares-count")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp, setter("pipelines.1.stages.0.shares", [1.0]), "pipelines[1].stages[0].shares", "expected 2 shares"
    )


@case("plan-unknown-schedule")
def _(tmp: Path) -> Case:
    return plan_case(tmp, setter("schedule", "zb-h1"), "schedule", "expected one of 1f1b, gpipe", "'zb-h1'")


@case("plan-predicted-not-a-mapping")
def _(tmp: Path) -> Case:
    return plan_case(tmp, setter("predicted", 1.5), "predicted", "expected a mapping", cmd="show")


@case("plan-dtype-differs-from-profile")
def _(tmp: Path) -> Case:
    return plan_case(tmp, setter("dtype", "bf16"), "dtype", "differs from the profile's fp32")


@case("plan-profile-changed-after-planning")
def _(tmp: Path) -> Case:
    data = plan_data(tmp)
    path = dump(data, tmp / "plan.yaml")
    profile = tmp / "profile.yaml"
    profile.write_text(profile.read_text(encoding="utf-8") + "# edited by hand\n", encoding="utf-8")
    return Case(["simulate", str(path)], str(path), "inputs.profile.sha256", ("has changed", "re-run 'hetplan plan'"))


@case("plan-input-path-missing")
def _(tmp: Path) -> Case:
    return plan_case(
        tmp, setter("inputs.cluster.path", "gone.yaml"), "inputs.cluster.path", "does not exist", "gone.yaml"
    )


# -- run log ---------------------------------------------------------------------------------


def runlog_case(tmp: Path, lines: list[str]) -> Path:
    path = tmp / "run.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@case("runlog-non-json-line")
def _(tmp: Path) -> Case:
    path = runlog_case(tmp, [json.dumps(run_record(0)), json.dumps(run_record(1)), "{step: 2, oops"])
    return Case(["validate", str(path)], str(path), "line 3", ("not JSON",))


@case("runlog-record-missing-field")
def _(tmp: Path) -> Case:
    record = run_record(0)
    del record["comm_s"]
    path = runlog_case(tmp, [json.dumps(run_record(0)), json.dumps(record)])
    return Case(["show", str(path)], str(path), "line 2.comm_s", ("missing required field",))


@case("runlog-empty")
def _(tmp: Path) -> Case:
    path = runlog_case(tmp, ["", "   "])
    return Case(["validate", str(path)], str(path), None, ("empty run log",))


# -- command-line arguments -------------------------------------------------------------------


@case("cli-unknown-device-in-devices-option")
def _(tmp: Path) -> Case:
    argv = ["profile", "gpt", "--analytic", "--devices", "A100-80GB,NOPE", "-o", str(tmp / "gpt.yaml")]
    return Case(argv, None, None, ("--devices", "unknown device type 'NOPE'"))


@case("cli-bad-micro-batches")
def _(tmp: Path) -> Case:
    argv = ["profile", "gpt", "--analytic", "--micro-batches", "0,x", "-o", str(tmp / "gpt.yaml")]
    return Case(argv, None, None, ("--micro-batches", "expected positive integers"))


@case("cli-unknown-command")
def _(tmp: Path) -> Case:
    return Case(["frobnicate"], None, None, ("No such command 'frobnicate'",))


@case("cli-missing-output-option")
def _(tmp: Path) -> Case:
    return Case(["profile", "gpt", "--analytic"], None, None, ("Missing option '-o'",))


@case("cli-unknown-option")
def _(tmp: Path) -> Case:
    return Case(["show", "--colour", "x.yaml"], None, None, ("No such option '--colour'",))


# --------------------------------------------------------------------------- the tests


def test_enough_distinct_cases() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    built = CASES[name](tmp_path)
    code, _out, err = run_cli(built.argv, capsys)
    assert code == 2, f"exit code {code}, stderr: {err}"
    assert_one_line_error(err, file=built.file, field=built.field, expect=built.expect)


# -- what must NOT be an error ------------------------------------------------------------------


def test_baselines_are_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = [
        dump(cluster_data(), tmp_path / "c.yaml"),
        dump(profile_data(), tmp_path / "p.yaml"),
        dump(catalog_data(), tmp_path / "d.yaml"),
        dump(plan_data(tmp_path), tmp_path / "plan.yaml"),
        runlog_case(tmp_path, [json.dumps(run_record(0)), json.dumps(run_record(1))]),
    ]
    code, out, err = run_cli(["validate", *map(str, files)], capsys)
    assert (code, err) == (0, "")
    assert out.count("ok ") == len(files)


def test_bare_numbers_where_units_are_fine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = cluster_data()
    data["network"] = {"bandwidth": 12.5e9, "latency": 1e-05}
    data["nodes"][0]["link"] = {"bandwidth": 600000000000, "latency": 0}
    path = dump(data, tmp_path / "bare.yaml")
    code, out, err = run_cli(["validate", str(path)], capsys)
    assert (code, err) == (0, "")
    assert "ok" in out


def test_devices_option_takes_an_alias(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "gpt.yaml"
    code, _out, err = run_cli(["profile", "gpt", "--analytic", "--devices", "A100-80", "-o", str(out_file)], capsys)
    assert (code, err) == (0, "")
    assert out_file.is_file()
    code, _out, err = run_cli(["validate", str(out_file)], capsys)
    assert (code, err) == (0, "")


def test_validate_reports_each_bad_file_and_keeps_going(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = dump(cluster_data(), tmp_path / "good.yaml")
    bad_a = dump({**cluster_data(), "name": ""}, tmp_path / "a.yaml")
    broken = copy.deepcopy(cluster_data())
    broken["network"]["bandwidth"] = "fast"
    bad_b = dump(broken, tmp_path / "b.yaml")
    code, out, err = run_cli(["validate", str(bad_a), str(good), str(bad_b)], capsys)
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"error: {bad_a}: name: ")
    assert lines[1].startswith(f"error: {bad_b}: network.bandwidth: ")
    assert str(good) in out


def test_emulated_type_of_an_emulated_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Valid: a type emulated from an emulated type runs on the root type's times, slowed by both factors."""
    from hetplan.contracts import load_cluster, load_profile

    data = cluster_data()
    data["nodes"][1]["devices"] = [
        {"type": "v100-half", "count": 1, "emulate": {"base": "V100-16GB", "slowdown": 2}},
        {"type": "v100-sixth", "count": 1, "emulate": {"base": "v100-half", "slowdown": 3}},
    ]
    path = dump(data, tmp_path / "emulated.yaml")
    code, _out, err = run_cli(["validate", str(path)], capsys)
    assert (code, err) == (0, "")
    cluster = load_cluster(path)
    profile = load_profile(dump(profile_data(), tmp_path / "p.yaml"))
    sixth = cluster.device("node1/1").type
    assert (sixth.emulates, sixth.slowdown) == ("V100-16GB", 6.0)
    assert sixth.label() == "v100-sixth (emulated: V100-16GB 6x slower)"
    assert profile.block_time(0, sixth, 1) == pytest.approx((0.012, 0.024))

"""`hetplan export`: every runtime's files parse, use only documented keys and say what the exported
plan says; the exported plan validates and simulates; what a runtime cannot express is reported."""

from __future__ import annotations

import ast
import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from builders import make_profile
from builders import run_cli as run
from conftest import EXPECTED, LAYER_STARTS, N_BLOCKS, SCENARIOS, pipeline, stage

import hetplan.cli as cli
from hetplan.contracts.model_profile import load_profile
from hetplan.contracts.plan import Plan, load_plan, load_plan_inputs
from hetplan.export import deepspeed, megatron, torchtitan
from hetplan.export.compare import export_rows
from hetplan.export.launch import TORCHRUN_FLAGS
from hetplan.export.megatron_args import MEGATRON_ARGUMENTS
from hetplan.export.partition import deepspeed_parameters, deepspeed_uniform
from hetplan.simulate import simulate

RUNTIMES = ("deepspeed", "megatron", "torchtitan")


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.console, "_width", 250)


def _undocumented(data: dict[str, Any], schema: dict[str, Any], where: str = "") -> list[str]:
    """Key paths of ``data`` that ``schema`` (key -> type or nested schema) does not list."""
    out = []
    for key, value in data.items():
        path = f"{where}.{key}" if where else key
        if key not in schema:
            out.append(path)
        elif isinstance(schema[key], dict):
            out += _undocumented(value, schema[key], path) if isinstance(value, dict) else [path]
    return out


def _flags(tokens: list[str], stop: Callable[[str], bool]) -> dict[str, str]:
    """``--flag value`` pairs from ``tokens`` up to the first token ``stop`` accepts."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(tokens) and not stop(tokens[i]):
        flags[tokens[i]] = tokens[i + 1]
        i += 2
    return flags


def _node_scripts(folder: Path) -> list[str]:
    """The export's launch scripts (one a node), each checked for the environment every export sets."""
    scripts = [p.read_text() for p in sorted(folder.glob("node-*.sh"))]
    assert scripts and not (folder / "launch.sh").exists()
    for text in scripts:
        assert "export CUDA_DEVICE_ORDER=PCI_BUS_ID" in text.splitlines()
        assert sum("torchrun" in line and not line.startswith("#") for line in text.splitlines()) == 1
    return scripts


def _torchrun_ranks(scripts: list[str]) -> list[str]:
    """Device addresses in rank order from the node scripts' torchrun lines (checking their flags)."""
    ranks: list[tuple[int, list[str]]] = []
    for text in scripts:
        node = ""
        for line in text.splitlines():
            if line.startswith("# on "):
                node = line[len("# on ") :].split(":")[0]
            if "torchrun" not in line or line.startswith("#"):
                continue
            tokens = shlex.split(line)
            env, at = tokens[0], tokens.index("torchrun")
            assert env.startswith("CUDA_VISIBLE_DEVICES=")
            flags = _flags(tokens[at + 1 :], lambda t: not t.startswith("-") or t == "-m")
            assert set(flags) <= TORCHRUN_FLAGS, flags
            indices = env.split("=")[1].split(",")
            assert int(flags["--nproc-per-node"]) == len(indices)
            assert int(flags["--nnodes"]) == len(scripts)
            ranks.append((int(flags["--node-rank"]), [f"{node}/{i}" for i in indices]))
    assert sorted(r for r, _ in ranks) == list(range(len(ranks)))
    return [a for _, devices in sorted(ranks) for a in devices]


def _check_grid(exported: Plan, ranks: list[str], stages: int, cuts: list[int], micro: int) -> None:
    """The exported plan is the runtime's grid: rank r runs stage r // D of replica r % D."""
    replicas = len(ranks) // stages
    assert len(ranks) == stages * replicas and len(exported.pipelines) == replicas
    for d, p in enumerate(exported.pipelines):
        assert [s.start for s in p.stages] + [N_BLOCKS] == cuts
        assert [s.devices for s in p.stages] == [(ranks[s * replicas + d],) for s in range(stages)]
        assert set(p.micro_batches) == {micro} and p.batch == exported.global_batch // replicas


def check_deepspeed(folder: Path, exported: Plan) -> None:
    config = json.loads((folder / "ds_config.json").read_text())
    assert _undocumented(config, deepspeed.DS_CONFIG_KEYS) == []
    module = json.loads((folder / "pipeline.json").read_text())
    assert set(module["PipelineModule"]) <= deepspeed.PIPELINE_MODULE_ARGS
    assert set(module["PipeDataParallelTopology"]) <= deepspeed.TOPOLOGY_ARGS
    ranks = _torchrun_ranks(_node_scripts(folder))
    stages = module["PipelineModule"]["num_stages"]
    replicas = len(ranks) // stages
    assert module["PipeDataParallelTopology"] == {"num_pp": stages, "num_dp": replicas}
    micro, steps = config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"]
    assert config["train_batch_size"] == micro * steps * replicas == exported.global_batch
    profile = load_profile(folder.parent / "gpt.yaml")
    method = module["PipelineModule"]["partition_method"]
    made = (
        deepspeed_parameters([b.params for b in profile.blocks], stages)
        if method == "parameters"
        else deepspeed_uniform(len(profile.blocks), stages)
    )
    assert module["parts"] == made  # what DeepSpeed itself computes from partition_method
    _check_grid(exported, ranks, stages, module["parts"], micro)
    assert all(len(p.micro_batches) == steps for p in exported.pipelines)
    dtype_keys = {"fp16", "bf16"} & set(config)
    assert dtype_keys == ({exported.dtype} & {"fp16", "bf16"} if exported.dtype else set())
    # the plan's optimizer, nothing of DeepSpeed's defaults: Adam without decay, no clipping
    assert config["gradient_clipping"] == 0.0 and config["zero_optimization"]["stage"] == exported.zero
    optimizer = {"adam": "Adam", "adamw": "AdamW", "sgd": "SGD", "momentum": "SGD"}[exported.optimizer]
    assert config["optimizer"]["type"] == optimizer
    if exported.optimizer == "adam":
        assert config["optimizer"]["params"]["adam_w_mode"] is False
        assert config["optimizer"]["params"]["weight_decay"] == 0.0


def check_megatron(folder: Path, exported: Plan) -> None:
    pairs = megatron.parse_arguments((folder / "megatron-args.txt").read_text())
    args = dict(pairs)
    assert len(args) == len(pairs)  # no argument twice
    for flag, value in pairs:  # as Megatron's parser would read it
        arg = MEGATRON_ARGUMENTS[flag]
        assert (arg.type is None) == (value is None), flag
        if arg.type is not None:
            arg.type(value)
            assert not arg.choices or value in arg.choices, flag
    scripts = _node_scripts(folder)
    ranks = _torchrun_ranks(scripts)
    pp, layers, tp = int(args["--pipeline-model-parallel-size"]), int(args["--num-layers"]), 1
    assert args["--tensor-model-parallel-size"] == "1" and len(ranks) % pp == 0
    assert all("CUDA_DEVICE_MAX_CONNECTIONS" not in text for text in scripts)  # only with TP > 1
    replicas, micro = len(ranks) // (pp * tp), int(args["--micro-batch-size"])
    assert int(args["--global-batch-size"]) == exported.global_batch
    assert exported.global_batch % (micro * replicas) == 0
    assert "--decoder-first-pipeline-num-layers" not in args and "--decoder-last-pipeline-num-layers" not in args
    # every optimizer setting explicit: Megatron's defaults (decay 0.01, clipping 1.0) left out would change it
    assert args["--clip-grad"] == "0.0" and "--weight-decay" in args and "--optimizer" in args
    if pp == 1:
        cuts = [0, N_BLOCKS]
        assert "--pipeline-model-parallel-layout" not in args
    else:
        stages = megatron.parse_layout(args["--pipeline-model-parallel-layout"])
        assert len(stages) == pp and stages[0][0] and stages[-1][2]
        assert sum(n for _, n, _ in stages) == layers
        counts = [n for _, n, _ in stages]
        ends = [sum(counts[: s + 1]) for s in range(pp - 1)]
        cuts = [0] + [LAYER_STARTS[e] if e < len(LAYER_STARTS) else N_BLOCKS - 1 for e in ends] + [N_BLOCKS]
    _check_grid(exported, ranks, pp, cuts, micro)
    assert all(len(p.micro_batches) == exported.global_batch // (micro * replicas) for p in exported.pipelines)


def titan_settings(folder: Path) -> dict[str, Any]:
    """``SETTINGS`` of the written config module, read without importing torchtitan."""
    text = (folder / f"{torchtitan.CONFIG_MODULE}.py").read_text()
    tree = ast.parse(text)
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "SETTINGS")
    return ast.literal_eval(ast.unparse(node.value).replace("float('inf')", "1e999"))


def check_torchtitan(folder: Path, exported: Plan) -> None:
    config = titan_settings(folder)
    assert _undocumented(config, torchtitan.JOB_CONFIG_KEYS) == []
    ranks = _torchrun_ranks(_node_scripts(folder))
    par, training = config["parallelism"], config["training"]
    pp, dp = par["pipeline_parallel_degree"], par["data_parallel_replicate_degree"]
    assert pp * dp * par["data_parallel_shard_degree"] * par["tensor_parallel_degree"] == len(ranks)
    assert training["local_batch_size"] * dp == training["global_batch_size"] == exported.global_batch
    assert training["max_norm"] == float("inf")
    parts = par.get("module_fqns_per_model_part", [])
    layer_of = [[int(m.split(".")[1]) for m in part if m.startswith("layers.")] for part in parts]
    starts = [LAYER_STARTS[layers[0]] if layers else N_BLOCKS - 1 for layers in layer_of[1:]]
    if parts:
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "lm_head"]
        assert [k for layers in layer_of for k in layers] == list(range(len(LAYER_STARTS)))
    micro = par.get("pipeline_parallel_microbatch_size", training["local_batch_size"])
    assert training["local_batch_size"] % micro == 0
    _check_grid(exported, ranks, pp, [0, *starts, N_BLOCKS], micro)
    if pp > 1:
        assert par["pipeline_parallel_schedule"] == {"1f1b": "1F1B", "gpipe": "GPipe"}[exported.schedule]
    assert config["optimizer"]["name"] in ("Adam", "AdamW")


CHECKS = {"deepspeed": check_deepspeed, "megatron": check_megatron, "torchtitan": check_torchtitan}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_each_export_parses_uses_documented_keys_and_reports_what_it_dropped(
    runtime: str, scenario: str, write_plan, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_file = write_plan(scenario, **SCENARIOS[scenario])
    folder = plan_file.parent / f"out-{runtime}"
    code, out, err = run(["export", runtime, str(plan_file), "-o", str(folder)], capsys)
    assert (code, err) == (0, "")
    exported = load_plan(folder / "exported-plan.yaml")
    CHECKS[runtime](folder, exported)
    dropped = [x[len("dropped: ") :] for x in out.splitlines() if x.startswith("dropped: ")]
    assert dropped == (folder / "dropped.txt").read_text().splitlines() == exported.details["dropped"]
    assert any(x.startswith(EXPECTED[scenario]) for x in dropped), dropped
    if runtime == "torchtitan" and scenario.endswith("sgd"):
        assert "optimizer sgd: torchtitan has no such optimizer; it runs adam" in dropped
    if runtime != "torchtitan" and "gpipe" in scenario:
        assert any(x.startswith("schedule gpipe: ") for x in dropped)
    if scenario == "three_stages_gpipe_sgd":  # torchrun orders a node's devices as the plan placed them
        assert not [x for x in dropped if x.startswith("device placement")]
    # the exported plan is a plan file like any other: it validates against its inputs and simulates
    assert run(["validate", str(folder / "exported-plan.yaml")], capsys)[0] == 0
    code, out, _ = run(["simulate", str(folder / "exported-plan.yaml"), "--json"], capsys)
    assert code == 0 and json.loads(out)["iteration_s"] == pytest.approx(exported.predicted["iteration_s"])
    assert exported.inputs["profile"] == {
        "path": "../gpt.yaml",
        "sha256": load_plan(plan_file).inputs["profile"]["sha256"],
    }


def _expressible(runtime: str, inputs: Path) -> dict[str, Any]:
    """A plan the runtime says exactly: equal pipelines, its own cut, one micro-batch size."""
    cut = 7
    if runtime == "deepspeed":
        profile = load_profile(inputs / "gpt.yaml")
        cut = deepspeed_parameters([b.params for b in profile.blocks], 2)[1]
    return {
        "optimizer": "adam",
        "pipelines": [
            pipeline(16, [4, 4, 4, 4], stage(0, cut, "n0/0"), stage(cut, N_BLOCKS, "n1/0")),
            pipeline(16, [4, 4, 4, 4], stage(0, cut, "n0/1"), stage(cut, N_BLOCKS, "n1/1")),
        ],
    }


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_plan_the_runtime_can_say_is_exported_unchanged(
    runtime: str, inputs: Path, write_plan, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_file = write_plan("uniform", **_expressible(runtime, inputs))
    folder = inputs / runtime
    code, out, err = run(["export", runtime, str(plan_file), "-o", str(folder)], capsys)
    assert (code, err) == (0, "")
    assert "dropped: nothing" in out and (folder / "dropped.txt").read_text() == ""
    original, exported = load_plan(plan_file), load_plan(folder / "exported-plan.yaml")
    assert [p.to_dict() for p in exported.pipelines] == [p.to_dict() for p in original.pipelines]
    assert (exported.schedule, exported.optimizer) == (original.schedule, original.optimizer)
    profile, cluster = load_plan_inputs(original)
    assert exported.predicted["iteration_s"] == pytest.approx(simulate(original, profile, cluster).iteration_s)


def test_megatron_says_the_exact_cut_with_its_layout_flag(write_plan, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = write_plan("three", **SCENARIOS["three_stages_gpipe_sgd"])
    folder = plan_file.parent / "m"
    assert run(["export", "megatron", str(plan_file), "-o", str(folder)], capsys)[0] == 0
    args = dict(megatron.parse_arguments((folder / "megatron-args.txt").read_text()))
    # hetplan cut [0, 3, 9, 14]: embedding + 1 layer, 3 layers, 2 layers + head
    assert args["--pipeline-model-parallel-layout"] == "Et|t*3|t*2L"
    assert [s.start for s in load_plan(folder / "exported-plan.yaml").pipelines[0].stages] == [0, 3, 9]
    # a stage of the embedding alone and one of the output alone are layouts too
    odd = write_plan(
        "odd", pipelines=[pipeline(16, [4] * 4, stage(0, 1, "n0/0"), stage(1, 13, "n0/1"), stage(13, 14, "n1/0"))]
    )
    assert run(["export", "megatron", str(odd), "-o", str(folder / "odd")], capsys)[0] == 0
    args = dict(megatron.parse_arguments((folder / "odd" / "megatron-args.txt").read_text()))
    assert args["--pipeline-model-parallel-layout"] == "E|t*6|L"
    assert megatron.parse_layout("E|t*6|L") == [(True, 0, False), (False, 6, False), (False, 0, True)]


def test_exports_are_deterministic(write_plan, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = write_plan("p", **SCENARIOS["replicated_stage"])
    for runtime in RUNTIMES:
        a, b = plan_file.parent / f"a-{runtime}", plan_file.parent / f"b-{runtime}"
        assert run(["export", runtime, str(plan_file), "-o", str(a)], capsys)[0] == 0
        assert run(["export", runtime, str(plan_file), "-o", str(b)], capsys)[0] == 0
        names = sorted(p.name for p in a.iterdir())
        assert names == sorted(p.name for p in b.iterdir())
        for name in names:
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_the_export_is_scored_beside_the_plan(write_plan, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = write_plan("p", **SCENARIOS["unequal_shares"])
    folder = plan_file.parent / "t"
    code, out, _ = run(["export", "torchtitan", str(plan_file), "-o", str(folder), "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    plan, exported = load_plan(plan_file), load_plan(folder / "exported-plan.yaml")
    profile, cluster = load_plan_inputs(plan)
    ours, theirs = simulate(plan, profile, cluster).iteration_s, simulate(exported, profile, cluster).iteration_s
    assert [r["name"] for r in report["compare"]] == ["hetplan", "torchtitan export"]
    assert report["compare"][0]["iteration_s"] == pytest.approx(ours)
    assert report["compare"][1]["iteration_s"] == pytest.approx(theirs)
    assert report["compare"][1]["speedup"] == pytest.approx(theirs / ours)
    assert export_rows(plan, exported, profile, cluster, name="x")[1]["iteration_s"] == pytest.approx(theirs)
    assert report["dropped"] and report["written"][-2:] == [
        str(folder / "exported-plan.yaml"),
        str(folder / "dropped.txt"),
    ]
    code, out, _ = run(["export", "torchtitan", str(plan_file), "-o", str(folder)], capsys)
    assert "Plan vs its torchtitan export" in out and "torchtitan export" in out


def test_an_unknown_runtime_is_one_line(write_plan, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = write_plan("p", **SCENARIOS["unequal_shares"])
    code, out, err = run(["export", "colossalai", str(plan_file), "-o", str(plan_file.parent / "x")], capsys)
    assert (code, out) == (2, "")
    assert err == "error: RUNTIME: unknown runtime 'colossalai'; expected one of deepspeed, megatron, torchtitan\n"
    assert not (plan_file.parent / "x").exists()


def test_a_plan_that_does_not_match_its_inputs_is_one_line(write_plan, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = write_plan("p", **SCENARIOS["unequal_shares"])
    profile = plan_file.parent / "gpt.yaml"
    profile.write_text(profile.read_text() + "\n# edited after planning\n")
    code, out, err = run(["export", "deepspeed", str(plan_file), "-o", str(plan_file.parent / "x")], capsys)
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith(f"error: {plan_file}: inputs.profile.sha256: ")
    short = write_plan("short", pipelines=[pipeline(8, [4, 4], stage(0, 7, "n0/0"), stage(7, 12, "n1/0"))])
    code, _, err = run(["export", "megatron", str(short), "-o", str(short.parent / "y")], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(  # its sha256 is the edited file's: the block ranges are what differ
        f"error: {short}: pipelines[0].stages[1].blocks: the last stage ends at block 12 but the profile has 14"
    )


def test_megatron_and_torchtitan_refuse_a_model_without_transformer_layers(
    inputs: Path, write_plan, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = make_profile(4, times={"A100-80GB": (0.001, 0.002), "V100-16GB": (0.002, 0.004)}, params=1000)
    profile.save(inputs / "mlp.yaml")
    plan_file = write_plan(
        "mlp-plan", profile="mlp.yaml", pipelines=[pipeline(8, [4, 4], stage(0, 2, "n0/0"), stage(2, 4, "n1/0"))]
    )
    for runtime, title in (("megatron", "Megatron-LM"), ("torchtitan", "torchtitan")):
        code, _, err = run(["export", runtime, str(plan_file), "-o", str(inputs / runtime)], capsys)
        assert code == 2 and err.count("\n") == 1
        assert err.startswith(f"error: {inputs / 'mlp.yaml'}: blocks: {title} trains transformers")
    code, out, err = run(["export", "deepspeed", str(plan_file), "-o", str(inputs / "ds")], capsys)
    assert (code, err) == (0, "") and "dropped: " in out  # DeepSpeed pipelines any list of layers


def test_an_export_that_does_not_fit_is_refused_in_one_line_or_written_anyway(
    inputs: Path, write_plan, capsys: pytest.CaptureFixture[str]
) -> None:
    # the V100s keep 0.1 GiB free: no stage of any export fits there
    (inputs / "cluster.yaml").write_text((inputs / "cluster.yaml").read_text() + "reserve: {V100-16GB: 15.9GiB}\n")
    plan_file = write_plan("p", **SCENARIOS["cut_differently"])
    folder = inputs / "ds"
    code, out, err = run(["export", "deepspeed", str(plan_file), "-o", str(folder)], capsys)
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith(f"error: {plan_file}: memory: the DeepSpeed export does not fit: rank 2 (n1/0, V100-16GB, ")
    assert re.search(r"stage 1\) needs [\d.]+ GiB of 16\.0 GiB \(and 1 more rank\(s\)\); nothing written", err)
    assert not folder.exists()
    code, out, err = run(["export", "deepspeed", str(plan_file), "-o", str(folder), "--write-anyway"], capsys)
    assert (code, err) == (0, "") and (folder / "exported-plan.yaml").exists()
    notes = [x for x in out.splitlines() if x.startswith("note: the exported plan does not fit: rank ")]
    assert [x.split(" (")[0] for x in notes] == [
        "note: the exported plan does not fit: rank 2",
        "note: the exported plan does not fit: rank 3",
    ]


def test_a_stage_split_over_devices_exports_the_micro_batch_each_device_ran(
    write_plan, capsys: pytest.CaptureFixture[str]
) -> None:
    # every stage splits each micro-batch of 4 over two devices: each device ran micro-batches of 2
    plan_file = write_plan(
        "split",
        pipelines=[pipeline(16, [4, 4, 4, 4], stage(0, 7, "n0/0", "n0/1"), stage(7, 14, "n1/0", "n1/1"))],
    )
    for runtime in RUNTIMES:
        folder = plan_file.parent / runtime
        assert run(["export", runtime, str(plan_file), "-o", str(folder)], capsys)[0] == 0
        exported = load_plan(folder / "exported-plan.yaml")
        assert len(exported.pipelines) == 2
        assert all(p.micro_batches == (2, 2, 2, 2) for p in exported.pipelines), runtime


def test_compare_with_shows_an_export_by_its_runtime(write_plan, capsys: pytest.CaptureFixture[str]) -> None:
    plan_file = write_plan("p", **SCENARIOS["unequal_shares"])
    folder = plan_file.parent / "mega"
    assert run(["export", "megatron", str(plan_file), "-o", str(folder)], capsys)[0] == 0
    code, out, _ = run(["compare", str(plan_file), "--with", str(folder / "exported-plan.yaml"), "--json"], capsys)
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)}
    exported = load_plan(folder / "exported-plan.yaml")
    assert rows["megatron export (mega)"]["iteration_s"] == pytest.approx(exported.predicted["iteration_s"])


def test_megatron_unties_the_head_only_where_the_model_does(
    inputs: Path, write_plan, capsys: pytest.CaptureFixture[str]
) -> None:
    """The zoo GPT's LM head is its own matrix unless ``head: tied`` (GPT-2's, Megatron's default):
    the export says ``--untie-embeddings-and-output-weights`` for the first only."""
    from hetplan.contracts.catalog import load_catalog
    from hetplan.profile.analytic import analytic_profile

    catalog = load_catalog()
    config = {"layers": 6, "hidden": 512, "heads": 8, "seq": 128, "vocab": 1024, "head": "tied"}
    devices = [catalog.get("A100-80GB"), catalog.get("V100-16GB")]
    analytic_profile("gpt", config, devices=devices, micro_batches=(1, 2, 4, 8)).save(inputs / "gpt-tied.yaml")
    for name, profile in (("untied", "gpt.yaml"), ("tied", "gpt-tied.yaml")):
        plan_file = write_plan(name, profile=profile, **SCENARIOS["three_stages_gpipe_sgd"])
        folder = plan_file.parent / f"m-{name}"
        code, _, err = run(["export", "megatron", str(plan_file), "-o", str(folder)], capsys)
        assert (code, err) == (0, "")
        args = dict(megatron.parse_arguments((folder / "megatron-args.txt").read_text()))
        assert ("--untie-embeddings-and-output-weights" in args) == (name == "untied")

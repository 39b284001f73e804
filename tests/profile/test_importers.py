"""Importers of other planners' profiles: real files from ../shared/external, small fixtures, bad input.

Totals are checked against an independent parse of the raw file (a regex for PipeDream, plain json
for Sailor and Piper); they agree up to float summation order (relative 1e-12).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from hetplan.contracts.model_profile import ModelProfile, load_profile, parse_profile
from hetplan.errors import HetplanError
from hetplan.profile.importers import IMPORTERS, import_pipedream, import_piper, import_sailor

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "external"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "importers"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason="../shared/external is absent (real profiles from other planners)"
)

PIPEDREAM_FILES = sorted(p.name for p in (SHARED / "pipedream").glob("*.graph.txt")) if SHARED.is_dir() else []
SAILOR_PROFILE = SHARED / "sailor" / "profiles.json"
#: Configs the shared folder lacks; written for the tests from the models' published dimensions.
SAILOR_EXTRA_CONFIGS = {
    "LLAMA-3-8": FIXTURES / "training_config_llama_3_8.json",
    "OPT-30": FIXTURES / "training_config_opt_30.json",
}
#: GNMT has no image input to infer the batch from; PipeDream's translation profiler README uses 64.
PIPEDREAM_BATCH = {"gnmt.graph.txt": 64, "gnmt_large.graph.txt": 64}
REL = 1e-12


def total_time(profile: ModelProfile, device: str, m: int) -> float:
    return sum(b.times[device][m].fwd + b.times[device][m].bwd for b in profile.blocks)


def round_trip(profile: ModelProfile) -> ModelProfile:
    again = parse_profile(profile.to_dict())
    assert [b.to_dict() for b in again.blocks] == [b.to_dict() for b in profile.blocks]
    return again


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def raises_located(path: Path, call, match: str) -> HetplanError:
    with pytest.raises(HetplanError, match=match) as info:
        call()
    assert path.name in str(info.value)
    return info.value


# --- PipeDream: real files -------------------------------------------------------------------------


def pipedream_raw(path: Path) -> tuple[int, float]:
    """Node count and total fwd+bwd seconds, read with a plain regex."""
    pattern = re.compile(r"^node\d+ -- .* -- forward_compute_time=([\d.]+), backward_compute_time=([\d.]+),", re.M)
    rows = pattern.findall(path.read_text())
    return len(rows), sum(float(f) + float(b) for f, b in rows) / 1000.0


@needs_shared
@pytest.mark.parametrize("name", PIPEDREAM_FILES)
def test_pipedream_shared_file_imports_exactly(name: str) -> None:
    path = SHARED / "pipedream" / name
    profile = import_pipedream(path, batch_size=PIPEDREAM_BATCH.get(name))
    count, total = pipedream_raw(path)
    batch = profile.source["profiled_batch"]
    assert len(profile.blocks) == count
    assert total_time(profile, "V100-16GB", batch) == pytest.approx(total, rel=REL)
    assert round_trip(profile).device_types() == ["V100-16GB"]


@needs_shared
@pytest.mark.parametrize(("name", "batch"), [("vgg16", 128), ("resnet50", 128), ("resnet18", 256), ("alexnet", 256)])
def test_pipedream_batch_is_inferred_for_image_models(name: str, batch: int) -> None:
    profile = import_pipedream(SHARED / "pipedream" / f"{name}.graph.txt")
    assert profile.source["profiled_batch"] == batch
    assert profile.model == {"name": name, "config": {}}
    assert profile.input_bytes == 3 * 224 * 224 * 4


@needs_shared
def test_pipedream_gnmt_needs_a_batch_size() -> None:
    path = SHARED / "pipedream" / "gnmt.graph.txt"
    err = raises_located(path, lambda: import_pipedream(path), "batch_size")
    assert err.field == "batch_size"


@needs_shared
def test_pipedream_resnet_skip_edges_raise_cut_bytes() -> None:
    profile = import_pipedream(SHARED / "pipedream" / "resnet18.graph.txt")
    by_name = {b.name: b for b in profile.blocks}
    # node12 (a block's input) also feeds node18 (the residual add): cuts inside the block carry both.
    inside = by_name["node14"]
    assert inside.output_bytes == pytest.approx(by_name["node14"].activation_bytes + by_name["node12"].activation_bytes)


# --- PipeDream: fixture ------------------------------------------------------------------------------


def test_pipedream_fixture_order_costs_and_skip_edge() -> None:
    profile = import_pipedream(FIXTURES / "skip.graph.txt")
    assert [b.name for b in profile.blocks] == ["node1", "node2", "node3", "node4", "node5"]
    assert [b.kind for b in profile.blocks] == ["Input", "Conv2d", "ReLU", "Conv2d", "Add"]
    assert profile.source["profiled_batch"] == 4  # 49152 = 4 x 3x32x32 fp32, conv output 4 x 8x32x32 fp32
    conv = profile.blocks[1]
    assert (conv.params, conv.param_bytes) == (224, 896.0)  # Conv2d(3, 8, 3x3): 3*8*9 + 8 parameters
    assert conv.activation_bytes == 131072 / 4
    assert conv.times == {"V100-16GB": {4: conv.times["V100-16GB"][4]}}
    assert (conv.times["V100-16GB"][4].fwd, conv.times["V100-16GB"][4].bwd) == (0.00125, 0.0025)
    assert conv.times["V100-16GB"][4].source == "imported"
    # cut after node4: node4 -> node5 and the skip node3 -> node5 both cross it
    assert [b.output_bytes for b in profile.blocks] == [12288.0, 32768.0, 32768.0, 65536.0, 0.0]
    assert total_time(profile, "V100-16GB", 4) == pytest.approx(0.0095, rel=REL)
    round_trip(profile)


def test_pipedream_ties_break_by_node_number_and_options(tmp_path: Path) -> None:
    row = "node{} -- {} -- forward_compute_time={}, backward_compute_time={}, activation_size={}, parameter_size=0.0"
    text = "\n".join(
        [
            row.format(9, "Add", 1.0, 1.0, 8.0),
            row.format(7, "Input1", 5.0, 0.0, 16.0),
            row.format(2, "Input0", 5.0, 0.0, "[8.0; 8.0]"),
            "\tnode7 -- node9",
            "\tnode2 -- node9",
        ]
    )
    path = write(tmp_path, "ties.graph.txt", text)
    profile = import_pipedream(path, batch_size=2, device_type="A100-40", drop_input_time=True)
    assert [b.name for b in profile.blocks] == ["node2", "node7", "node9"]
    assert profile.device_types() == ["A100-40GB"]
    assert [b.output_bytes for b in profile.blocks] == [8.0, 16.0, 0.0]  # list activation summed: 16 / 2
    assert total_time(profile, "A100-40GB", 2) == pytest.approx(0.002)  # Input times dropped
    assert profile.source["dropped_input_time_ms"] == {"node2": [5.0, 0.0], "node7": [5.0, 0.0]}


def test_pipedream_graph_named_graph_txt_takes_folder_name(tmp_path: Path) -> None:
    folder = tmp_path / "vggish"
    folder.mkdir()
    path = write(folder, "graph.txt", (FIXTURES / "skip.graph.txt").read_text())
    assert import_pipedream(path).model["name"] == "vggish"


# --- PipeDream: bad input ------------------------------------------------------------------------------


def test_pipedream_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "absent.graph.txt"
    raises_located(path, lambda: import_pipedream(path), "file not found")


def test_pipedream_malformed_line_names_line(tmp_path: Path) -> None:
    good = (FIXTURES / "skip.graph.txt").read_text().splitlines()
    good.insert(
        2, "node6 -- Broken -- forward_compute_time=abc, backward_compute_time=0, activation_size=0, parameter_size=0"
    )
    path = write(tmp_path, "bad.graph.txt", "\n".join(good))
    err = raises_located(path, lambda: import_pipedream(path), "not a number")
    assert err.field == "line 3"
    path2 = write(tmp_path, "junk.graph.txt", "node1 -- Input -- forward_compute_time=1.0\nhello world\n")
    assert raises_located(path2, lambda: import_pipedream(path2, batch_size=1), "node line").field == "line 1"


def test_pipedream_cycle_empty_unknown_edge_and_device(tmp_path: Path) -> None:
    line = (
        "node{} -- ReLU -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=4.0, parameter_size=0.0"
    )
    cyclic = write(
        tmp_path, "cyc.graph.txt", f"{line.format(1)}\n{line.format(2)}\n\tnode1 -- node2\n\tnode2 -- node1\n"
    )
    raises_located(cyclic, lambda: import_pipedream(cyclic, batch_size=1), "cycle")
    empty = write(tmp_path, "empty.graph.txt", "\n\n")
    raises_located(empty, lambda: import_pipedream(empty, batch_size=1), "empty")
    no_nodes = write(tmp_path, "edges.graph.txt", "\tnode1 -- node2\n")
    raises_located(no_nodes, lambda: import_pipedream(no_nodes, batch_size=1), "empty graph")
    dangling = write(tmp_path, "dangling.graph.txt", f"{line.format(1)}\n\tnode1 -- node5\n")
    assert raises_located(dangling, lambda: import_pipedream(dangling, batch_size=1), "node5").field == "line 2"
    fixture = FIXTURES / "skip.graph.txt"
    raises_located(fixture, lambda: import_pipedream(fixture, device_type="Z80"), "unknown GPU type")
    raises_located(fixture, lambda: import_pipedream(fixture, batch_size=0), "positive integer")


# --- Sailor: real file -----------------------------------------------------------------------------------


def sailor_models() -> list[str]:
    return list(json.loads(SAILOR_PROFILE.read_text())) if SAILOR_PROFILE.is_file() else []


@needs_shared
@pytest.mark.parametrize("model", sailor_models())
def test_sailor_shared_models_import_exactly(model: str) -> None:
    raw = json.loads(SAILOR_PROFILE.read_text())[model]
    profile = import_sailor(SAILOR_PROFILE, model=model, training_config=SAILOR_EXTRA_CONFIGS.get(model))
    round_trip(profile)
    file_names = profile.source["gpu_types"]
    checked = 0
    for device, by_mb in ((d, profile.blocks[0].times[d]) for d in profile.device_types()):
        for m in by_mb:
            layers = raw[file_names[device]][str(m)]["1"]
            assert len(profile.blocks) == len(layers)
            expected = sum(f + b for f, b, _ in layers.values())
            assert total_time(profile, device, m) == pytest.approx(expected, rel=REL)
            checked += 1
    expected_points = sum(1 for by_mb in raw.values() for by_tp in by_mb.values() if "1" in by_tp)
    assert checked == expected_points  # every (GPU, micro-batch) at TP 1 was imported, nothing else


@needs_shared
def test_sailor_gpu_names_map_onto_the_catalog() -> None:
    profile = import_sailor(SAILOR_PROFILE, model="opt-350")  # case-insensitive
    assert profile.device_types() == [
        "V100-16GB",
        "A100-40GB",
        "A100-80GB",
        "GH200",
        "TITAN-RTX",
        "RTX-2080",
        "RTX-3090",
    ]
    assert profile.source["training_config"] == "training_config_opt_350.json"
    assert [b.kind for b in profile.blocks[:2]] == ["embedding", "transformer"] and profile.blocks[-1].kind == "head"
    h, s = 1024, 2048
    assert profile.blocks[1].params == 12 * h * h + 13 * h
    assert profile.blocks[1].output_bytes == 2 * s * h


@needs_shared
def test_sailor_tensor_parallel_skips_gpu_types_without_it() -> None:
    profile = import_sailor(
        SAILOR_PROFILE, model="LLAMA-3-8", training_config=SAILOR_EXTRA_CONFIGS["LLAMA-3-8"], tensor_parallel=4
    )
    assert profile.source["tensor_parallel"] == 4
    assert [b.kind for b in profile.blocks[-2:]] == ["final_norm", "head"]
    one = import_sailor(SAILOR_PROFILE, model="LLAMA-3-8", training_config=SAILOR_EXTRA_CONFIGS["LLAMA-3-8"])
    assert one.device_types() == ["GH200"]  # LLaMA-3-8 has TP 1 times on GH-96 only
    assert {s.split(":")[0] for s in one.source["skipped"] if "skipped" in s} == {"A100-40", "V100-16"}


# --- Sailor: fixture -----------------------------------------------------------------------------------


def test_sailor_fixture_exact_values() -> None:
    profile = import_sailor(FIXTURES / "tiny_sailor.json", model="tiny-gpt")
    assert profile.device_types() == ["A100-40GB", "V100-16GB"]
    # RTX-3090 has degree-2 times only: it is in the profile's degree 2, not its base
    assert profile.source["gpu_types"] == {"A100-40GB": "A100-40", "V100-16GB": "V100-16", "RTX-3090": "RTX-3090"}
    assert set(profile.blocks[1].tensor_parallel[2].times) == {"A100-40GB", "V100-16GB", "RTX-3090"}
    assert profile.source["micro_batches"] == {"A100-40GB": [1, 2], "V100-16GB": [1]}
    assert "RTX-3090: skipped, no micro-batch size at tensor-parallel degree 1" in profile.source["skipped"]
    assert "V100-16 micro-batch 4: no tensor-parallel degree 1 (has 2)" in profile.source["skipped"]
    assert profile.source["update_s"] == {"A100-40GB": {1: 0.25, 2: 0.25}, "V100-16GB": {1: 0.5}}
    assert profile.dtype == "fp16"
    emb, l0, l1, head = profile.blocks
    assert [b.name for b in profile.blocks] == ["embedding", "layer0", "layer1", "head"]
    h, s, a, vocab = 64, 16, 4, 100
    assert emb.params == vocab * h + s * h
    assert l0.params == l1.params == 12 * h * h + 13 * h == 49984
    assert l0.param_bytes == 2 * 49984
    assert l0.activation_bytes == s * h * (34 + 5 * a * s / h) == 39936
    assert l0.output_bytes == 2 * s * h and emb.output_bytes == 2 * s * h and head.output_bytes == 0
    assert l0.flops_fwd == 24 * s * h * h + 4 * s * s * h
    assert head.params == vocab * h + 2 * h
    assert head.activation_bytes == 4 * s * h * (1 + vocab / h)
    t = l0.times["A100-40GB"][2]
    assert (t.fwd, t.bwd, t.source) == (0.25, 0.5, "imported")
    assert total_time(profile, "V100-16GB", 1) == pytest.approx(0.004 + 1.5 + 1.5 + 0.75, rel=REL)
    assert profile.input_bytes == 8 * s
    round_trip(profile)


def test_sailor_fixture_gpu_selection_and_tp() -> None:
    path = FIXTURES / "tiny_sailor.json"
    chosen = import_sailor(path, model="Tiny-GPT", gpu_types=["V100-16GB"])
    assert chosen.device_types() == ["V100-16GB"]
    tp2 = import_sailor(path, model="Tiny-GPT", gpu_types=["RTX-3090", "V100-16"], tensor_parallel=2)
    assert tp2.device_types() == ["RTX-3090", "V100-16GB"]
    assert tp2.source["micro_batches"] == {"RTX-3090": [1], "V100-16GB": [4]}


# --- Sailor: bad input ---------------------------------------------------------------------------------


def test_sailor_missing_file_and_json_error(tmp_path: Path) -> None:
    missing = tmp_path / "profiles.json"
    raises_located(missing, lambda: import_sailor(missing, model="x"), "file not found")
    broken = write(tmp_path, "broken.json", '{"OPT-350": {"A100-40": [1, 2,}}\n')
    err = raises_located(broken, lambda: import_sailor(broken, model="OPT-350"), "not valid JSON")
    assert err.field is not None and err.field.startswith("line 1")


def test_sailor_unknown_model_lists_available() -> None:
    path = FIXTURES / "tiny_sailor.json"
    err = raises_located(path, lambda: import_sailor(path, model="GPT-5"), "unknown model")
    assert "Tiny-GPT" in str(err) and "Other-Model" in str(err)


def test_sailor_unknown_gpu_missing_config_and_no_tp(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "tiny_sailor.json").read_text())
    data["Tiny-GPT"]["Mystery-GPU"] = data["Tiny-GPT"]["A100-40"]
    path = write(tmp_path, "mystery.json", json.dumps(data))
    config = FIXTURES / "training_config_tiny.json"
    raises_located(
        path, lambda: import_sailor(path, model="Tiny-GPT", training_config=config), "unknown GPU type 'Mystery-GPU'"
    )
    # an unknown type the caller did not ask for is left alone
    chosen = import_sailor(path, model="Tiny-GPT", training_config=config, gpu_types=["A100-40"])
    assert chosen.device_types() == ["A100-40GB"]
    fixture = FIXTURES / "tiny_sailor.json"
    raises_located(fixture, lambda: import_sailor(fixture, model="Other-Model"), "training_config")
    raises_located(
        fixture, lambda: import_sailor(fixture, model="Tiny-GPT", tensor_parallel=8), "tensor-parallel degree 8"
    )
    raises_located(
        fixture, lambda: import_sailor(fixture, model="Tiny-GPT", gpu_types=["T4"]), "no times for this model"
    )
    raises_located(
        config, lambda: import_sailor(fixture, model="Other-Model", training_config=config), "describes model"
    )


def test_sailor_bad_config_and_layer_rows(tmp_path: Path) -> None:
    fixture = FIXTURES / "tiny_sailor.json"
    no_hidden = write(tmp_path, "cfg.json", json.dumps({"model": "Tiny-GPT", "sequence_length": 16}))
    err = raises_located(
        no_hidden, lambda: import_sailor(fixture, model="Tiny-GPT", training_config=no_hidden), "hidden_size"
    )
    assert err.field == "hidden_size"
    data = json.loads(fixture.read_text())
    data["Tiny-GPT"]["A100-40"]["1"]["1"]["2"] = [0.1, "fast"]
    bad = write(tmp_path, "rows.json", json.dumps(data))
    config = FIXTURES / "training_config_tiny.json"
    err = raises_located(bad, lambda: import_sailor(bad, model="Tiny-GPT", training_config=config), "forward_s")
    assert err.field == "Tiny-GPT.A100-40.1.1.2"


# --- Piper: real file ------------------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("variant", ["vanilla", "activation recomp"])
def test_piper_shared_file_imports_exactly(variant: str) -> None:
    path = SHARED / "piper" / "bert32a100.json"
    raw = json.loads(path.read_text())
    expected = sum(next(t for t in n["TMPCs"]["1"] if t["id"] == variant)["timePerSample"] for n in raw["nodes"])
    profile = import_piper(path, variant=variant)
    assert len(profile.blocks) == len(raw["nodes"])
    assert total_time(profile, "A100-80GB", 1) == pytest.approx(expected, rel=REL)
    assert round_trip(profile).device_types() == ["A100-80GB"]
    layer = next(b for b in profile.blocks if b.kind == "ParallelTransformerLayer")
    assert layer.params == 176997120 // 4
    t = layer.times["A100-80GB"][1]
    assert t.bwd == pytest.approx(2 * t.fwd)


# --- Piper: fixture --------------------------------------------------------------------------------------


def test_piper_fixture_order_costs_and_skip_edge() -> None:
    profile = import_piper(FIXTURES / "tiny_piper.json", device_type="A100-80")
    assert [b.name for b in profile.blocks] == ["node0", "node1", "node2", "node3", "node4", "node5"]
    layer = "ParallelTransformerLayer"
    assert [b.kind for b in profile.blocks] == ["tensor", "Embedding", "tensor", layer, layer, "Pooler"]
    # cut after node3: node3 -> node4 and the mask's skip edge node2 -> node4 both cross it
    assert [b.output_bytes for b in profile.blocks] == [64.0, 1024.0, 1280.0, 1280.0, 1024.0, 0.0]
    layer = profile.blocks[3]
    t = layer.times["A100-80GB"][1]
    assert (t.fwd, t.bwd) == (0.25, 0.5)
    assert (layer.params, layer.param_bytes, layer.activation_bytes) == (1000, 4000.0, 6000.0)
    assert profile.source["variants"] == ["vanilla", "activation recomp"]
    assert profile.source["memory_usage_b_total"] == 2 * (4000 + 8000 + 4000 + 400)
    assert total_time(profile, "A100-80GB", 1) == pytest.approx(1.875, rel=REL)
    round_trip(profile)


def test_piper_fixture_variant_and_samples_per_unit() -> None:
    profile = import_piper(FIXTURES / "tiny_piper.json", variant="activation recomp", samples_per_unit=4)
    layer = profile.blocks[3]
    assert layer.activation_bytes == 1536.0 / 4
    assert layer.times["A100-80GB"][1].fwd + layer.times["A100-80GB"][1].bwd == pytest.approx(1.0 / 4)
    assert profile.blocks[2].output_bytes == 1280.0 / 4


# --- Piper: bad input ------------------------------------------------------------------------------------


def test_piper_json_error_and_empty(tmp_path: Path) -> None:
    broken = write(tmp_path, "broken.json", '{"nodes": [\n  {"id": 0,,}\n]}')
    err = raises_located(broken, lambda: import_piper(broken), "not valid JSON")
    assert err.field is not None and err.field.startswith("line 2")
    empty = write(tmp_path, "empty.json", '{"nodes": [], "edges": []}')
    raises_located(empty, lambda: import_piper(empty), "empty graph")
    missing = tmp_path / "nothing.json"
    raises_located(missing, lambda: import_piper(missing), "file not found")


def test_piper_cycle_unknown_variant_device_and_edges(tmp_path: Path) -> None:
    data = json.loads((FIXTURES / "tiny_piper.json").read_text())
    data["edges"].append({"sourceId": 5, "destId": 1, "communicationCost": 1.0})
    cyclic = write(tmp_path, "cyclic.json", json.dumps(data))
    raises_located(cyclic, lambda: import_piper(cyclic), "cycle")
    fixture = FIXTURES / "tiny_piper.json"
    err = raises_located(fixture, lambda: import_piper(fixture, variant="zero-3"), "no variant 'zero-3'")
    assert "activation recomp" in str(err)
    raises_located(fixture, lambda: import_piper(fixture, device_type="Abacus"), "unknown GPU type")
    data = json.loads(fixture.read_text())
    data["edges"][0]["destId"] = 42
    dangling = write(tmp_path, "dangling.json", json.dumps(data))
    assert raises_located(dangling, lambda: import_piper(dangling), "node 42").field == "edges[0].destId"
    data = json.loads(fixture.read_text())
    data["nodes"][1]["TMPCs"]["1"][0]["timePerSample"] = -1
    negative = write(tmp_path, "negative.json", json.dumps(data))
    assert raises_located(negative, lambda: import_piper(negative), "non-negative").field.startswith("nodes[1]")


def test_imported_profiles_save_and_load_as_yaml(tmp_path: Path) -> None:
    profiles = {
        "pipedream": import_pipedream(FIXTURES / "skip.graph.txt"),
        "sailor": import_sailor(FIXTURES / "tiny_sailor.json", model="Tiny-GPT"),
        "piper": import_piper(FIXTURES / "tiny_piper.json"),
    }
    for name, profile in profiles.items():
        out = tmp_path / f"{name}.profile.yaml"
        profile.save(out)
        loaded = load_profile(out)
        assert [b.to_dict() for b in loaded.blocks] == [b.to_dict() for b in profile.blocks]
        assert loaded.source["importer"] == name


def test_registry_names_the_three_importers() -> None:
    expected = {"pipedream": import_pipedream, "sailor": import_sailor, "piper": import_piper}
    assert expected == IMPORTERS

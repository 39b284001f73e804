"""The Sailor importer brings every tensor-parallel degree of the file into one profile: the
file's times at each degree, per-device sizes by Megatron's split, the all-reduce marked as
measured inside the times."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetplan.contracts import load_catalog
from hetplan.contracts.model_profile import parse_profile
from hetplan.profile.importers import import_sailor

SHARED_EXTERNAL = Path(__file__).resolve().parents[2].parent / "shared" / "external"
needs_shared = pytest.mark.skipif(
    not SHARED_EXTERNAL.is_dir(), reason="../shared/external is absent (real profiles from other planners)"
)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "importers"
SAILOR = SHARED_EXTERNAL / "sailor" / "profiles.json"
EXTRA_CONFIGS = {
    "LLAMA-3-8": FIXTURES / "training_config_llama_3_8.json",
    "OPT-30": FIXTURES / "training_config_opt_30.json",
}


def _degrees_in_file(raw: dict, names: dict[str, str]) -> set[int]:
    return {int(t) for name in names.values() for by_tp in raw[name].values() for t in by_tp}


@needs_shared
@pytest.mark.parametrize("model", list(json.loads(SAILOR.read_text())) if SAILOR.is_file() else [])
def test_every_degree_of_the_real_file_is_imported_exactly(model: str) -> None:
    raw = json.loads(SAILOR.read_text())[model]
    profile = import_sailor(SAILOR, model=model, training_config=EXTRA_CONFIGS.get(model))
    assert parse_profile(profile.to_dict()).to_dict() == profile.to_dict()  # round trip
    names = profile.source["gpu_types"]
    layer = next(i for i, b in enumerate(profile.blocks) if b.kind == "transformer")
    degrees = set(profile.tp_degrees(layer))
    assert degrees - {1} == _degrees_in_file(raw, names) - {1}
    assert profile.source["tensor_parallel"] == sorted(degrees)
    checked = 0
    for t in sorted(degrees - {1}):
        shard = profile.blocks[layer].tensor_parallel[t]
        assert shard.allreduce_in_time
        for device, by_mb in shard.times.items():
            for m, timing in by_mb.items():
                row = raw[names[device]][str(m)][str(t)][str(layer)]
                assert (timing.fwd, timing.bwd) == (row[0], row[1])
                checked += 1
    expected = sum(1 for name in names.values() for by_tp in raw[name].values() for k in by_tp if k != "1")
    assert checked == expected  # every (GPU, micro-batch) at every degree >= 2, nothing else
    # the embedding and the head: vocabulary-parallel at every degree, the file's first and last rows
    last = len(profile.blocks) - 1
    assert profile.tp_degrees(0) == profile.tp_degrees(last) == profile.tp_degrees(layer)
    # every block (LLaMA's final norm too, whole on every member) at every degree: a TP stage may hold any
    assert all(profile.tp_degrees(b) == profile.tp_degrees(layer) for b in range(len(profile.blocks)))
    for b in (i for i, block in enumerate(profile.blocks) if block.kind == "final_norm"):
        for t in sorted(degrees - {1}):
            assert profile.shard(b, t).params == profile.blocks[b].params and profile.shard(b, t).allreduce_bytes == 0
    for row in (0, last):
        for t in sorted(degrees - {1}):
            shard = profile.blocks[row].tensor_parallel[t]
            assert shard.allreduce_in_time
            for device, by_mb in shard.times.items():
                for m, timing in by_mb.items():
                    assert (timing.fwd, timing.bwd) == tuple(raw[names[device]][str(m)][str(t)][str(row)][:2])


@needs_shared
def test_opt350_layer_sizes_per_degree() -> None:
    profile = import_sailor(SAILOR, model="OPT-350")
    h, s, a = 1024, 2048, 16
    assert profile.tp_degrees(1) == (1, 2, 4, 8)
    for t in (2, 4, 8):
        shard = profile.shard(1, t)
        assert shard.params == (12 * h * h + 7 * h) // t + 6 * h
        assert shard.activation_bytes == pytest.approx(s * h * (10 + 24 / t + 5 * a * s / (h * t)))
        assert shard.selective_bytes == pytest.approx(5 * a * s * s / t)
        assert shard.allreduce_bytes == 2 * 2 * s * h
    # the embedding and head: each member ceil(V/t) rows of the vocabulary (the 2048 positions whole)
    v = 50272
    for t in (2, 4, 8):
        rows = -(-v // t)
        assert profile.shard(0, t).params == rows * h + s * h
        assert profile.shard(25, t).params == rows * h + 2 * h  # OPT-350 has no final-norm block
        assert profile.shard(25, t).activation_bytes == pytest.approx(4 * s * h + 4 * s * rows)
        assert profile.shard(0, t).allreduce_bytes == s * h and profile.shard(25, t).allreduce_bytes == s * h + 6 * s
    assert profile.shard(25, 8).params < profile.shard(25, 1).params / 7
    # the V100 has degree 8 times, the A100-40 not: a degree is offered per type
    catalog = load_catalog()
    assert profile.tp_degrees(1, catalog.get("V100-16GB")) == (1, 2, 4, 8)
    assert profile.tp_degrees(1, catalog.get("A100-40GB")) == (1, 2, 4)


@needs_shared
def test_a_type_without_degree_1_appears_in_its_degrees_only() -> None:
    profile = import_sailor(SAILOR, model="LLAMA-3-8", training_config=EXTRA_CONFIGS["LLAMA-3-8"])
    assert profile.device_types() == ["GH200"]
    layer = profile.blocks[1]
    assert set(layer.tensor_parallel[4].times) == {"A100-40GB", "V100-16GB", "GH200"}
    assert set(layer.tensor_parallel[8].times) == {"V100-16GB"}


def test_fixture_degrees_and_the_single_degree_form() -> None:
    path = FIXTURES / "tiny_sailor.json"
    profile = import_sailor(path, model="Tiny-GPT", gpu_types=["A100-40", "V100-16"])
    assert profile.tp_degrees(1) == (1, 2)
    two = profile.blocks[1].tensor_parallel[2]
    raw = json.loads(path.read_text())["Tiny-GPT"]
    assert two.times["A100-40GB"][1].fwd == raw["A100-40"]["1"]["2"]["1"][0]
    assert set(two.times) == {"A100-40GB", "V100-16GB"} and list(two.times["V100-16GB"]) == [4]
    assert profile.tp_degrees(0) == profile.tp_degrees(len(profile.blocks) - 1) == (1, 2)
    single = import_sailor(path, model="Tiny-GPT", gpu_types=["A100-40", "V100-16"], tensor_parallel=1)
    assert all(b.tensor_parallel == {} for b in single.blocks) and single.source["tensor_parallel"] == 1


@needs_shared
@pytest.mark.parametrize("vocab_parallel", [True, False])
def test_a_tensor_parallel_plan_over_the_whole_model_simulates(vocab_parallel: bool) -> None:
    """Megatron-DeepSpeed's layout, which Sailor's runs had: every stage at TP 2, the first holding
    the embedding and the last the head. It used to be refused (the embedding had no degree 2);
    kept whole (``vocab_parallel: false``) the head's stage holds the whole table and logits."""
    from builders import make_cluster

    from hetplan.contracts.plan import Pipeline, Plan, Stage
    from hetplan.simulate import simulate

    profile = import_sailor(SAILOR, model="OPT-350", gpu_types=["RTX-3090"])
    cluster = make_cluster([("n0", [("RTX-3090", 4)])], intra="32GB/s")
    stages = (
        Stage(0, 13, ("n0/0", "n0/1"), (1.0,), tensor_parallel=2, vocab_parallel=vocab_parallel),
        Stage(13, 26, ("n0/2", "n0/3"), (1.0,), tensor_parallel=2, vocab_parallel=vocab_parallel),
    )
    sim = simulate(Plan(8, [Pipeline(8, (1,) * 8, stages)]), profile, cluster)
    head = sim.devices["n0/2"].memory
    if vocab_parallel:
        assert head.weights == pytest.approx(2 * sum(profile.shard(b, 2).params for b in range(13, 26)))
    else:
        assert head.weights == pytest.approx(
            2 * (sum(profile.shard(b, 2).params for b in range(13, 25)) + profile.blocks[25].params)
        )

"""Deterministic files: the same object dumps to the same bytes, and dump -> load -> dump is a fixed point."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from test_bad_input import plan_data, profile_data

from hetplan.contracts import check_plan, load_plan, load_plan_inputs, load_profile, split_micro_batch
from hetplan.contracts.yamlio import dump_yaml, read_mapping


def _write(data: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    data = profile_data(6)
    # odd floats and a second micro-batch size: repr must keep them exactly
    data["blocks"][0]["time"]["A100-80GB"][8] = {"fwd": 0.1 + 0.2, "bwd": 1 / 3, "source": "measured", "spread": 0.05}
    data["blocks"][0]["flops_fwd"] = 8.6e9
    data["input_bytes"] = 1024
    data["source"] = {"tool": "test", "note": "by hand"}
    return _write(data, tmp_path / "gpt.profile.yaml")


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    data = plan_data(tmp_path)
    data["predicted"] = {"iteration_s": 0.048, "samples_per_s": 166.5, "bubble_fraction": 0.292}
    data["baselines"] = {"uniform": {"iteration_s": 0.06}}
    return _write(data, tmp_path / "plan.yaml")


def test_profile_dumps_are_identical(profile_file: Path) -> None:
    profile = load_profile(profile_file)
    first = dump_yaml(profile.to_dict())
    second = dump_yaml(profile.to_dict())
    assert first == second
    assert dump_yaml(load_profile(profile_file).to_dict()) == first  # a second load too


def test_profile_dump_load_dump_is_a_fixed_point(profile_file: Path, tmp_path: Path) -> None:
    original = load_profile(profile_file)
    once = tmp_path / "once.yaml"
    twice = tmp_path / "twice.yaml"
    original.save(once)
    reloaded = load_profile(once)
    reloaded.save(twice)
    assert once.read_bytes() == twice.read_bytes()
    # and nothing was lost on the way
    assert [b.to_dict() for b in reloaded.blocks] == [b.to_dict() for b in original.blocks]
    assert reloaded.blocks[0].times["A100-80GB"][8].fwd == 0.1 + 0.2
    assert reloaded.blocks[0].times["A100-80GB"][8].bwd == 1 / 3
    assert reloaded.input_bytes == 1024
    assert reloaded.source == {"tool": "test", "note": "by hand"}


def test_plan_dumps_are_identical(plan_file: Path) -> None:
    plan = load_plan(plan_file)
    assert dump_yaml(plan.to_dict()) == dump_yaml(plan.to_dict())
    assert dump_yaml(load_plan(plan_file).to_dict()) == dump_yaml(plan.to_dict())


def test_plan_dump_load_dump_is_a_fixed_point(plan_file: Path) -> None:
    plan = load_plan(plan_file)
    # saved beside the original, so the relative input paths still resolve
    once = plan_file.parent / "once.plan.yaml"
    twice = plan_file.parent / "twice.plan.yaml"
    plan.save(once)
    reloaded = load_plan(once)
    reloaded.save(twice)
    assert once.read_bytes() == twice.read_bytes()
    assert reloaded.pipelines == plan.pipelines
    assert reloaded.inputs == plan.inputs
    assert reloaded.predicted == plan.predicted
    profile, cluster = load_plan_inputs(reloaded)  # the sha256 still match
    check_plan(reloaded, cluster, profile)


def test_dump_has_no_anchors_and_keeps_order() -> None:
    shared = {"fwd": 0.5, "bwd": 1.0}
    text = dump_yaml({"z": shared, "a": shared, "list": [1, 2, 3]})
    assert "&" not in text and "*" not in text
    assert text.index("z:") < text.index("a:")
    assert "list: [1, 2, 3]" in text


def test_floats_are_written_shortest_round_trip(tmp_path: Path) -> None:
    values = [0.1 + 0.2, 1 / 3, 5e-06, 1e-05, 12.5e9, 1e300, 3.0]
    path = tmp_path / "f.yaml"
    path.write_text(dump_yaml({"schema": "x", "v": values}), encoding="utf-8")
    assert read_mapping(path)["v"] == values
    text = path.read_text()
    assert "5.0e-06" in text and "1.0e+300" in text
    assert "!!float" not in text  # '5e-06' would need a tag in YAML 1.1; '5.0e-06' reads as a float


# --------------------------------------------------------------------------- split_micro_batch

shares_lists = st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=1, max_size=8)


@settings(derandomize=True, max_examples=150, deadline=None)
@given(size=st.integers(min_value=0, max_value=4096), shares=shares_lists)
def test_split_micro_batch_properties(size: int, shares: list[float]) -> None:
    total = sum(shares)
    counts = split_micro_batch(size, tuple(shares))
    assert len(counts) == len(shares)
    assert sum(counts) == size
    assert all(c >= 0 for c in counts)
    for count, share in zip(counts, shares, strict=True):
        assert abs(count - size * share / total) < 1.0
    assert split_micro_batch(size, tuple(shares)) == counts  # deterministic


@settings(derandomize=True, max_examples=60, deadline=None)
@given(size=st.integers(min_value=1, max_value=1024), n=st.integers(min_value=1, max_value=8))
def test_split_equal_shares_differ_by_at_most_one(size: int, n: int) -> None:
    counts = split_micro_batch(size, tuple(1.0 / n for _ in range(n)))
    assert max(counts) - min(counts) <= 1
    assert list(counts) == sorted(counts, reverse=True)  # ties go to the lower index


def test_split_examples() -> None:
    assert split_micro_batch(8, (1.0,)) == (8,)
    assert split_micro_batch(8, (0.5, 0.5)) == (4, 4)
    assert split_micro_batch(5, (0.5, 0.5)) == (3, 2)
    assert split_micro_batch(10, (0.75, 0.25)) == (8, 2)  # 7.5 / 2.5: the tie goes to the first
    assert split_micro_batch(3, (0.2, 0.3, 0.5)) == (1, 1, 1)


def test_number_like_strings_survive_a_round_trip(tmp_path: Path) -> None:
    values = {"schema": "x", "names": ["1e3", "8.6e9", "5", "1.0", "true", "null", "node0/1"], "n": [1e3, 5, 1.0]}
    path = tmp_path / "s.yaml"
    path.write_text(dump_yaml(values), encoding="utf-8")
    assert read_mapping(path) == values


# --------------------------------------------------------------------------- the documented examples

DOCS = Path(__file__).resolve().parents[2] / "docs" / "contracts"
EXAMPLE_NAMES = {
    "hetplan/devices/v1": "devices.yaml",
    "hetplan/cluster/v1": "cluster.yaml",
    "hetplan/model-profile/v1": "gpt.profile.yaml",
    "hetplan/plan/v1": "plan.yaml",
    "hetplan/pool/v1": "pool.yaml",
}


def _documented_examples() -> dict[str, str]:
    """File name -> text of every complete example in docs/contracts/*.md."""
    examples: dict[str, str] = {}
    for page in sorted(DOCS.glob("*.md")):
        for lang, body in re.findall(r"```(yaml|json)\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            first = body.lstrip().splitlines()[0] if body.strip() else ""
            if lang == "yaml" and first.startswith("schema: hetplan/"):
                name = EXAMPLE_NAMES[first.split(":", 1)[1].strip()]
            elif lang == "json" and '"schema": "hetplan/run-log/v1"' in first:
                name = "run.jsonl"
            else:
                continue
            assert name not in examples, f"two complete {name} examples in {DOCS}"
            examples[name] = body
    return examples


@pytest.mark.skipif(not DOCS.is_dir(), reason="docs/contracts is absent")
def test_documented_examples_load(tmp_path: Path) -> None:
    from hetplan.contracts.anyfile import load_any

    examples = _documented_examples()
    assert set(examples) == {*EXAMPLE_NAMES.values(), "run.jsonl"}
    for name, text in examples.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    for name in examples:
        kind, obj = load_any(tmp_path / name)
        if kind == "plan":  # the plan example names the profile and cluster examples beside it
            profile, cluster = load_plan_inputs(obj)
            check_plan(obj, cluster, profile)
        if kind in ("profile", "plan"):
            once = tmp_path / f"once-{name}"
            obj.save(once)
            again = load_profile(once) if kind == "profile" else load_plan(once)
            assert dump_yaml(again.to_dict()) == once.read_text(encoding="utf-8")


def test_a_plan_with_a_non_numeric_prediction_is_refused(tmp_path) -> None:
    from hetplan.contracts.plan import load_plan
    from hetplan.errors import HetplanError

    path = tmp_path / "p.yaml"
    path.write_text(
        "schema: hetplan/plan/v1\ninputs: {profile: {path: a.yaml}, cluster: {path: b.yaml}}\nglobal_batch: 1\n"
        "pipelines: [{batch: 1, micro_batches: [1], stages: [{blocks: [0, 1], devices: [n0/0]}]}]\n"
        "predicted: {iteration_s: x}\n"
    )
    with pytest.raises(HetplanError, match=r"predicted\.iteration_s: expected a number"):
        load_plan(path)

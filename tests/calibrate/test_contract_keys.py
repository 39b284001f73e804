"""The contract keys calibration added: a cluster's collective_efficiency and calibrated note, a
profile time's ``calibrated`` source, and the measurements file itself."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from builders import make_profile
from calib_synth import CLUSTER

from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.measurements import load_measurements
from hetplan.contracts.model_profile import parse_profile
from hetplan.contracts.yamlio import write_yaml
from hetplan.errors import HetplanError
from hetplan.simulate.costs import CostModel


def _cluster(**extra: object):
    return parse_cluster({**copy.deepcopy(CLUSTER), **extra}, file="c.yaml", catalog=load_catalog())


def test_collective_efficiency_divides_every_all_reduce() -> None:
    profile = make_profile(2, times={"A100-80GB": (1.0, 2.0), "V100-16GB": (2.0, 4.0)}, params=1000)
    plain, slow = _cluster(), _cluster(collective_efficiency=0.8)
    assert plain.collective_efficiency == 1.0
    devices = [plain.device("n0/0"), plain.device("n1/0")]  # across the network
    base = CostModel(profile, plain).allreduce(1e9, devices)
    assert base > 0
    assert CostModel(profile, slow).allreduce(1e9, [slow.device(d.address) for d in devices]) == pytest.approx(
        base / 0.8
    )
    assert CostModel(profile, slow).allreduce(1e9, [slow.device("n0/0")]) == 0.0  # one device: nothing to do


@pytest.mark.parametrize(
    ("value", "reason"),
    [(0, "positive"), (-1, "positive"), ("fast", "expected a number"), (1000, "<= 100")],
)
def test_bad_collective_efficiency(value: object, reason: str) -> None:
    with pytest.raises(HetplanError) as err:
        _cluster(collective_efficiency=value)
    assert err.value.field == "collective_efficiency"
    assert reason in err.value.reason


def test_calibrated_note_is_a_free_mapping() -> None:
    assert _cluster(calibrated={"anything": [1, 2]}).calibrated == {"anything": [1, 2]}
    with pytest.raises(HetplanError) as err:
        _cluster(calibrated="yes")
    assert err.value.field == "calibrated"


def test_profile_times_may_be_calibrated() -> None:
    data = make_profile(1).to_dict()
    data["blocks"][0]["time"]["A100-80GB"][1]["source"] = "calibrated"
    assert parse_profile(data).blocks[0].times["A100-80GB"][1].source == "calibrated"
    data["blocks"][0]["time"]["A100-80GB"][1]["source"] = "guessed"
    with pytest.raises(HetplanError):
        parse_profile(data)


def test_measurements_paths_are_relative_to_the_file_and_names_default_to_files(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / "sub" / name).write_text("schema: hetplan/plan/v1\n")
    (tmp_path / "sub" / "b.jsonl").write_text("{}\n")
    write_yaml(
        {
            "schema": "hetplan/measurements/v1",
            "description": "two runs",
            "runs": [
                {"plan": "a.yaml", "iteration_s": 1.5, "peak_memory": {"n0/0": "11.2GiB"}},
                {"plan": "a.yaml", "iteration_s": 1.6},
                {"plan": "b.yaml", "run_log": "b.jsonl", "name": "second"},
            ],
        },
        tmp_path / "sub" / "m.yaml",
    )
    m = load_measurements(tmp_path / "sub" / "m.yaml")
    assert [r.name for r in m.runs] == ["a.yaml", "a.yaml #1", "second"]
    assert m.runs[0].plan == tmp_path / "sub" / "a.yaml"
    assert m.runs[0].peak_memory == {"n0/0": pytest.approx(11.2 * 2**30)}
    assert m.runs[2].run_log == tmp_path / "sub" / "b.jsonl"
    assert m.runs[2].iteration_s is None

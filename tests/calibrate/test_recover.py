"""Calibration finds known factors again: measurements simulated with scaled times and links."""

from __future__ import annotations

from pathlib import Path

import pytest
from calib_synth import TRUTH, write_case

from hetplan.calibrate import calibrate_files

PRIORS = {
    "compute[A100-80GB]": 1.0,
    "compute[V100-16GB]": 1.0,
    "bandwidth[network]": 10e9,
    "collective_efficiency": 1.0,
}


def _fitted(result) -> dict[str, object]:
    return {p.name: p for p in result.params}


@pytest.mark.parametrize("logs", [True, False], ids=["run-logs", "iteration-times-only"])
def test_recovers_compute_network_and_collective_within_2_percent(tmp_path: Path, logs: bool) -> None:
    files = write_case(tmp_path / "in", TRUTH, logs=logs)
    result, _ = calibrate_files(*files, tmp_path / "out")
    fitted = _fitted(result)
    assert len(result.runs) == 6
    for name, true in TRUTH.items():
        p = fitted[name]
        assert p.identified, (name, p.reason)
        assert p.value == pytest.approx(true, rel=0.02), name
        # the inputs were far off: the fit moved each parameter most of the way, not a little
        assert abs(p.value / PRIORS[name] - 1) > 0.15
    for run in result.runs:
        assert abs(run.before / run.measured - 1) > 0.3, run.name  # the input files predict badly ...
        assert abs(run.residual) < 0.01, run.name  # ... the calibrated ones well


def test_per_kind_factors_where_run_logs_tell_kinds_apart(tmp_path: Path) -> None:
    truth = {
        "compute[A100-80GB/attention]": 1.5,
        "compute[A100-80GB/mlp]": 2.0,
        "compute[V100-16GB/attention]": 2.3,
        "compute[V100-16GB/mlp]": 2.3,
    }
    files = write_case(tmp_path / "in", truth, kinds=("attention", "mlp"))
    result, _ = calibrate_files(*files, tmp_path / "out")
    assert set(result.per_kind) == {"A100-80GB", "V100-16GB"}
    fitted = _fitted(result)
    for name, true in truth.items():
        assert fitted[name].identified
        assert fitted[name].value == pytest.approx(true, rel=0.02), name


def test_one_factor_per_type_where_every_rank_runs_the_same_mix_of_kinds(tmp_path: Path) -> None:
    # data parallel on two A100s: each rank computes every block, so attention and mlp always
    # appear together in the same proportion and cannot be told apart
    truth = {"compute[A100-80GB/attention]": 1.5, "compute[A100-80GB/mlp]": 2.0}
    files = write_case(tmp_path / "in", truth, kinds=("attention", "mlp"), names=["dp-n0"])
    result, _ = calibrate_files(*files, tmp_path / "out")
    assert result.per_kind == []
    fitted = _fitted(result)
    assert "compute[A100-80GB/attention]" not in fitted
    assert fitted["compute[A100-80GB]"].identified
    # one factor between the two, explaining the measured compute exactly
    assert 1.5 < fitted["compute[A100-80GB]"].value < 2.0
    assert abs(result.runs[0].residual) < 0.01

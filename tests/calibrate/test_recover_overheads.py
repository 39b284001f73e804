"""Calibration finds a known per-call overhead and overlap slowdown again (docs/calibration.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from calib_synth import uneven_plan, write_case

from hetplan.calibrate import calibrate_files


def test_recovers_a_known_overhead_and_overlap_slowdown_within_2_percent(tmp_path: Path) -> None:
    truth = {
        "compute[A100-80GB]": 1.3,
        "overhead[A100-80GB]": 2e-3,  # 2 ms a stage call beside 2-6 ms blocks: micro-batches of 1 pay most
        "overhead[V100-16GB]": 3e-3,
        "overlap[A100-80GB]": 1.5,  # compute beside the uneven plan's all-reduce on n0/1 runs 1.5x slower
    }
    files = write_case(tmp_path / "in", truth, extra={"uneven": uneven_plan()})
    result, _ = calibrate_files(*files, tmp_path / "out")
    fitted = {p.name: p for p in result.params}
    for name, true in truth.items():
        assert fitted[name].identified, (name, fitted[name].reason)
        assert fitted[name].value == pytest.approx(true, rel=0.02), name
    assert result.fitted_type_figures["A100-80GB"]["micro_batch_s"] == pytest.approx(2e-3, rel=0.02)
    assert result.fitted_type_figures["A100-80GB"]["overlap_slowdown"] == pytest.approx(1.5, rel=0.02)
    for run in result.runs:
        assert abs(run.residual) < 0.01, run.name


def test_overlap_unused_where_no_collective_overlaps_a_backward(tmp_path: Path) -> None:
    files = write_case(tmp_path / "in", {"overhead[A100-80GB]": 1e-3}, names=["pipe-n0", "dp-n0"])
    result, _ = calibrate_files(*files, tmp_path / "out")
    fitted = {p.name: p for p in result.params}
    assert fitted["overlap[A100-80GB]"].reason.startswith("no run log with a rank of this type")
    assert fitted["overhead[A100-80GB]"].identified
    assert fitted["overhead[A100-80GB]"].value == pytest.approx(1e-3, rel=0.02)


def test_overheads_are_not_fitted_from_iteration_times_alone(tmp_path: Path) -> None:
    files = write_case(tmp_path / "in", {"overhead[A100-80GB]": 1e-3}, names=["pipe-n0", "dp-n0"], logs=False)
    result, _ = calibrate_files(*files, tmp_path / "out")
    fitted = {p.name: p for p in result.params}
    assert not fitted["overhead[A100-80GB]"].identified
    assert fitted["overhead[A100-80GB]"].reason.startswith("no run log")


def test_fitted_overheads_are_written_to_the_cluster_file_and_planned_with(tmp_path: Path) -> None:
    """The written cluster carries ``overheads:`` for the identified figures only; loading it gives
    every device of the type those figures (the contract applies them over the catalog's)."""
    from hetplan.calibrate.write import CLUSTER_FILE
    from hetplan.contracts.cluster import load_cluster

    files = write_case(tmp_path / "in", {"overhead[A100-80GB]": 1e-3}, names=["pipe-n0", "dp-n0"])
    calibrate_files(*files, tmp_path / "out")
    written = load_cluster(tmp_path / "out" / CLUSTER_FILE)
    a100 = next(d.type for n in written.nodes for d in n.devices if d.type.name == "A100-80GB")
    assert a100.micro_batch_s == pytest.approx(1e-3, rel=0.02)
    assert a100.overlap_slowdown == 1.0  # not identified (nothing overlapped): the catalog's, not written
    raw = (tmp_path / "out" / CLUSTER_FILE).read_text()
    assert "overheads:" in raw and "overlap_slowdown" not in raw.split("overheads:")[1].split("calibrated:")[0]

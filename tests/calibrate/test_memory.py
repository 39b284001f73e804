"""The memory reserve per type: measured process peaks minus the predicted tensors, robustly."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from calib_synth import CLUSTER, TRUTH, plans, profile, write_case

from hetplan.calibrate import calibrate_files
from hetplan.contracts import load_cluster
from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.cluster import parse_cluster
from hetplan.simulate import simulate

GiB = 2.0**30


def _tensors() -> dict[tuple[str, str], tuple[float, float, float]]:
    """(plan, device) -> (live tensor bytes, fragmentation, communicators' buffers), predicted from
    the input files."""
    cluster = parse_cluster(copy.deepcopy(CLUSTER), file="cluster.yaml", catalog=load_catalog())
    prof = profile()
    out = {}
    for name, plan in plans().items():
        for address, d in simulate(plan, prof, cluster).devices.items():
            m = d.memory
            out[(name, address)] = (
                m.weights + m.gradients + m.optimizer + m.activations,
                m.fragmentation,
                m.comm_buffers,
            )
    return out


def test_reserve_is_the_median_of_measured_minus_predicted_floored_at_zero(tmp_path: Path) -> None:
    tensors = _tensors()

    def peak(plan: str, device: str, reserve: float) -> float:
        """What a process holds: its tensors, fragmentation, the reserve and its communicators'
        buffers (NCCL's, which the walk prices beside the reserve: the fit must not count them in it)."""
        t, fragmentation, comm = tensors[(plan, device)]
        return t * (1.0 + fragmentation) + reserve + comm

    assert tensors[("pipe-n0", "n0/0")][2] > 0  # the A100s run NCCL: buffers the fit must leave out

    true_reserve = 3.0 * GiB
    peaks = {
        "pipe-n0": {"n0/0": peak("pipe-n0", "n0/0", true_reserve), "n0/1": peak("pipe-n0", "n0/1", true_reserve)},
        # one odd device (another process on the GPU): the median ignores it
        "dp-n0": {"n0/0": peak("dp-n0", "n0/0", true_reserve + 20 * GiB), "n0/1": peak("dp-n0", "n0/1", true_reserve)},
        # a V100 that used less than its predicted tensors: no negative reserve
        "pipe-n1": {"n1/0": peak("pipe-n1", "n1/0", -0.1 * GiB)},
    }
    files = write_case(tmp_path / "in", TRUTH, names=list(peaks), peak_memory=peaks)
    result, (_, cluster_path) = calibrate_files(*files, tmp_path / "out")
    reserves = {r.type: r for r in result.reserves}
    assert reserves["A100-80GB"].reserve == pytest.approx(true_reserve, abs=1.0)
    assert len(reserves["A100-80GB"].points) == 4
    assert reserves["V100-16GB"].reserve == 0.0
    assert reserves["A100-80GB"].before != reserves["A100-80GB"].reserve  # it did change
    # written as the cluster's reserve key, which the cluster contract applies to the type
    written = yaml.safe_load(cluster_path.read_text())
    assert written["reserve"] == {"A100-80GB": round(true_reserve), "V100-16GB": 0}
    loaded = load_cluster(cluster_path)
    assert loaded.device_types["A100-80GB"].reserve_bytes == pytest.approx(true_reserve, abs=1.0)
    assert loaded.device_types["V100-16GB"].reserve_bytes == 0.0


def test_run_log_peaks_are_reported_not_fitted(tmp_path: Path) -> None:
    files = write_case(tmp_path / "in", TRUTH, names=["pipe-n0"])
    result, (_, cluster_path) = calibrate_files(*files, tmp_path / "out")
    assert result.reserves == []
    assert {p.device for p in result.allocator_peaks} == {"n0/0", "n0/1"}
    assert all(p.measured == 1e9 for p in result.allocator_peaks)  # what the synthetic log says
    assert "reserve" not in yaml.safe_load(cluster_path.read_text())

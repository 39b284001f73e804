"""``hetplan calibrate PROFILE CLUSTER MEASUREMENTS -o DIR`` as one call: read, fit, write.

result, written = calibrate_files("gpt.profile.yaml", "cluster.yaml", "measured.yaml", "calibrated/")
"""

from __future__ import annotations

from pathlib import Path

from hetplan.calibrate.calibration import Calibration, calibrate
from hetplan.calibrate.write import build_note, output_mappings, write_outputs
from hetplan.contracts.catalog import load_catalog
from hetplan.contracts.cluster import parse_cluster
from hetplan.contracts.measurements import load_measurements
from hetplan.contracts.model_profile import load_profile
from hetplan.contracts.yamlio import read_mapping, schema_of

__all__ = ["calibrate_files"]


def calibrate_files(
    profile_path: str | Path, cluster_path: str | Path, measurements_path: str | Path, out_dir: str | Path
) -> tuple[Calibration, tuple[Path, Path]]:
    """Calibrate the profile and cluster to the measured runs; write ``out_dir/profile.yaml`` and
    ``out_dir/cluster.yaml``. The cluster is read as its raw mapping too: the output is that
    mapping with values changed, so the user's keys, order and unit strings survive."""
    profile = load_profile(profile_path)
    raw = read_mapping(cluster_path)
    schema_of(raw, cluster_path)
    cluster = parse_cluster(raw, file=str(cluster_path), catalog=load_catalog())
    measurements = load_measurements(measurements_path)
    result = calibrate(profile, raw, cluster, measurements)
    note = build_note(
        result,
        profile=Path(profile_path),
        cluster=Path(cluster_path),
        measurements_path=Path(measurements_path),
        measurements=measurements,
    )
    profile_data, cluster_data = output_mappings(result, note)
    return result, write_outputs(profile_data, cluster_data, Path(out_dir))

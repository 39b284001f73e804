"""The two files ``hetplan calibrate`` writes, and the note of the fit each carries.

* ``profile.yaml``: the input profile with every time of a fitted device type scaled by its
  factor(s) and marked ``source: calibrated``; the note under ``source.calibrated``.
* ``cluster.yaml``: the input cluster's own mapping (its keys, order and unit strings kept) with
  the fitted link figures and ``collective_efficiency`` replaced, ``reserve: {TYPE: bytes}`` for the
  types with measured peaks, ``overheads: {TYPE: {micro_batch, overlap_slowdown}}`` for the types
  whose per-call overhead or overlap slowdown was fitted, and the note under ``calibrated``.

Both load with ``load_profile`` / ``load_cluster`` and are the same bytes for the same inputs: the
note names inputs by file name and sha256 (not by path, which would differ between two output
folders), and every figure in it has six significant digits.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from hetplan import __version__
from hetplan.calibrate.calibration import Calibration, round6
from hetplan.calibrate.fit import LAMBDA, NOISE, PRIOR_WIDTH, RESOLUTION
from hetplan.calibrate.inputs import WARMUP_STEPS
from hetplan.contracts.measurements import Measurements
from hetplan.contracts.yamlio import sha256_of, write_yaml

__all__ = ["CLUSTER_FILE", "PROFILE_FILE", "build_note", "output_mappings", "write_outputs"]

PROFILE_FILE = "profile.yaml"
CLUSTER_FILE = "cluster.yaml"


def _file(path: Path) -> dict[str, str]:
    return {"file": path.name, "sha256": sha256_of(path)}


def _maybe(x: float | None) -> float | None:
    return None if x is None else round6(x)


def build_note(
    result: Calibration, *, profile: Path, cluster: Path, measurements_path: Path, measurements: Measurements
) -> dict[str, Any]:
    """What was fitted, from what, and how well: the same note goes into both files."""
    runs = []
    for run, fit in zip(measurements.runs, result.runs, strict=True):
        entry: dict[str, Any] = {"name": fit.name, "plan": _file(run.plan)}
        if run.run_log is not None:
            entry["run_log"] = _file(run.run_log)
            entry["steps"] = fit.steps
        entry |= {
            "measured_s": round6(fit.measured),
            "predicted_before_s": round6(fit.before),
            "predicted_after_s": round6(fit.after),
            "residual": round6(fit.residual),
            "loo_error": _maybe(fit.loo_error),
        }
        runs.append(entry)
    params = {
        p.name: {
            "prior": round6(p.prior),
            "value": round6(p.value),
            "status": "identified" if p.identified else "prior",
            "why": p.reason,
        }
        for p in result.params
    }
    reserves = {
        r.type: {"bytes": int(r.reserve), "before": round(r.before), "devices": len(r.points)} for r in result.reserves
    }
    note: dict[str, Any] = {
        "tool": f"hetplan {__version__}",
        "inputs": {
            "profile": _file(profile),
            "cluster": _file(cluster),
            "measurements": _file(measurements_path),
        },
        "method": {
            "residuals": "simulated / measured - 1: iteration time per run, compute time per run-log rank",
            "noise": NOISE,
            "prior_width": PRIOR_WIDTH,
            "regularisation": LAMBDA,
            "resolution_needed": RESOLUTION,
            "warmup_steps": WARMUP_STEPS,
            "compute_factors": (
                f"per block kind for {', '.join(result.per_kind)}; per device type otherwise"
                if result.per_kind
                else "one per device type"
            ),
        },
        "runs": runs,
        "parameters": params,
    }
    if reserves:
        note["reserve"] = reserves
    return note


def output_mappings(result: Calibration, note: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The profile and cluster mappings to write."""
    assert result.fitted_profile is not None
    profile = result.fitted_profile
    source = {k: v for k, v in profile.source.items() if k != "calibrated"}
    profile_data = replace(profile, source={**source, "calibrated": note}).to_dict()
    cluster_data = {k: v for k, v in result.fitted_raw_cluster.items() if k not in ("reserve", "calibrated")}
    reserve = dict(result.fitted_raw_cluster.get("reserve") or {})
    for r in result.reserves:
        reserve[r.type] = int(r.reserve)
    if reserve:
        cluster_data["reserve"] = reserve
    identified = {p.name for p in result.params if p.identified}
    overheads = _overheads(result.fitted_type_figures, result.fitted_raw_cluster.get("overheads") or {}, identified)
    if overheads:
        cluster_data["overheads"] = overheads
    cluster_data["calibrated"] = note
    return profile_data, cluster_data


#: The per-type figures calibration fits: ``DeviceType`` field -> (parameter kind, cluster file key).
_OVERHEAD_KEYS = {"micro_batch_s": ("overhead", "micro_batch"), "overlap_slowdown": ("overlap", "overlap_slowdown")}


def _overheads(fitted: dict[str, dict[str, float]], given: dict[str, Any], identified: set[str]) -> dict[str, Any]:
    """``overheads: {TYPE: {micro_batch: seconds, overlap_slowdown: factor}}``: the input cluster's,
    with each figure the measurements identified replaced (the cluster contract applies them over the
    catalog's). A figure left at its prior is not written: the prior of a figure the catalog does
    not state is a starting scale for the fit, not an estimate to plan with."""
    out = {name: dict(v) for name, v in given.items()}
    for name in sorted(fitted):
        for field_name, value in fitted[name].items():
            kind, key = _OVERHEAD_KEYS[field_name]
            if f"{kind}[{name}]" in identified:
                out.setdefault(name, {})[key] = round6(value)
    return out


def write_outputs(profile_data: dict[str, Any], cluster_data: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """Write both files into ``out_dir`` (created); returns their paths."""
    profile_path, cluster_path = out_dir / PROFILE_FILE, out_dir / CLUSTER_FILE
    write_yaml(profile_data, profile_path)
    write_yaml(cluster_data, cluster_path)
    return profile_path, cluster_path

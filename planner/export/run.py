"""Export a plan for one runtime: structure, files, the exported plan and what was dropped.

    result = export_plan("deepspeed", plan, profile, cluster, "out/")
    result.written        # paths, in writing order
    result.dropped        # one line per feature the runtime cannot express
    result.exported       # out/exported-plan.yaml: exactly what the files express, on the same inputs

The exported plan is a hetplan plan file like any other (``simulate``, ``show``, ``compare``
read it); its ``details`` name the plan it came from and the dropped features, its ``predicted``
section is its own simulation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan, check_plan
from hetplan.errors import HetplanError
from hetplan.export import deepspeed, megatron, torchtitan
from hetplan.export.structure import Runtime, Uniform, uniform_structure
from hetplan.simulate import SimResult, simulate

__all__ = ["EXPORTED_PLAN", "RUNTIMES", "ExportResult", "export_plan", "runtime_named"]

RUNTIMES: dict[str, Runtime] = {r.name: r for r in (deepspeed.RUNTIME, megatron.RUNTIME, torchtitan.RUNTIME)}
EXPORTED_PLAN = "exported-plan.yaml"
DROPPED = "dropped.txt"


@dataclass
class ExportResult:
    runtime: Runtime
    uniform: Uniform
    exported: Plan
    sim: SimResult  # of the exported plan
    written: list[Path]

    @property
    def dropped(self) -> tuple[str, ...]:
        return self.uniform.dropped

    def memory_notes(self) -> list[str]:
        """Devices the exported plan does not fit on (the runtime would run out of memory there)."""
        return [
            f"the exported plan does not fit on {a} ({d.type}): pipeline {d.pipeline} stage {d.stage}"
            for a, d in self.sim.devices.items()
            if not d.memory.fits
        ]


def runtime_named(name: str) -> Runtime:
    """The runtime called ``name``; an unknown name is a one-line error listing the known ones."""
    try:
        return RUNTIMES[name.lower()]
    except KeyError:
        raise HetplanError(
            f"unknown runtime {name!r}; expected one of {', '.join(RUNTIMES)}", field="RUNTIME"
        ) from None


def _inputs_beside(plan: Plan, folder: Path) -> dict[str, dict[str, str]]:
    """The plan's inputs with paths relative to ``folder`` (where the exported plan is written)."""
    out = {}
    for key, entry in plan.inputs.items():
        raw = Path(entry["path"])
        source = raw if raw.is_absolute() or plan.file is None else Path(plan.file).parent / raw
        item = {"path": Path(os.path.relpath(source.resolve(), folder.resolve())).as_posix()}
        if "sha256" in entry:
            item["sha256"] = entry["sha256"]
        out[key] = item
    return out


def export_plan(
    runtime_name: str, plan: Plan, profile: ModelProfile, cluster: Cluster, out_dir: str | Path
) -> ExportResult:
    """Write ``runtime_name``'s configuration of ``plan`` into ``out_dir`` (see the module docstring).

    Raises :class:`HetplanError` for an unknown runtime, a plan that does not match its inputs, or a
    model the runtime cannot pipeline (Megatron-LM and torchtitan need transformer layers).
    """
    runtime = runtime_named(runtime_name)
    check_plan(plan, cluster, profile)
    uniform = uniform_structure(plan, profile, cluster, runtime)
    folder = Path(out_dir)
    exported = uniform.plan(plan)
    exported.inputs = _inputs_beside(plan, folder)
    sim = simulate(exported, profile, cluster)
    exported.predicted = sim.predicted()
    details: dict[str, Any] = {
        "exported_for": runtime.name,
        "exported_from": Path(plan.file).name if plan.file else None,
        "dropped": list(uniform.dropped),
    }
    exported.details = {k: v for k, v in details.items() if v is not None}
    files = runtime.render(uniform, plan, profile, cluster)  # checked against its documented keys

    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = folder / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    exported.file = str(folder / EXPORTED_PLAN)
    exported.save(exported.file)
    written.append(folder / EXPORTED_PLAN)
    (folder / DROPPED).write_text("".join(f"{line}\n" for line in uniform.dropped), encoding="utf-8")
    written.append(folder / DROPPED)
    return ExportResult(runtime=runtime, uniform=uniform, exported=exported, sim=sim, written=written)

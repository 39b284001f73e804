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
from hetplan.units import format_bytes

__all__ = ["EXPORTED_PLAN", "RUNTIMES", "ExportResult", "export_plan", "runtime_named", "unfit_ranks"]

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

    @property
    def fits(self) -> bool:
        """Whether every rank of the exported plan fits in its device's memory (hetplan's simulator)."""
        return not unfit_ranks(self.uniform, self.sim)

    def memory_notes(self) -> list[str]:
        """Ranks the exported plan does not fit on (the runtime would run out of memory there)."""
        return [f"the exported plan does not fit: {line}" for line in unfit_ranks(self.uniform, self.sim)]


def unfit_ranks(uniform: Uniform, sim: SimResult) -> list[str]:
    """``rank R (device, type, stage S): needs X of Y`` for every rank over its memory, by rank."""
    out = []
    for rank, address in enumerate(uniform.ranks):
        d = sim.devices.get(address)
        if d is not None and not d.memory.fits:
            out.append(
                f"rank {rank} ({address}, {d.type}, stage {d.stage}) needs {format_bytes(d.memory.total)} of "
                f"{format_bytes(d.memory.capacity)}"
            )
    return out


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
    runtime_name: str,
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    out_dir: str | Path,
    *,
    write_unfit: bool = False,
) -> ExportResult:
    """Write ``runtime_name``'s configuration of ``plan`` into ``out_dir`` (see the module docstring).

    Raises :class:`HetplanError` for an unknown runtime, a plan that does not match its inputs, a
    model the runtime cannot pipeline (Megatron-LM and torchtitan need transformer layers), or an
    exported plan that hetplan's simulator finds does not fit in memory (naming the first rank over
    and its memory; nothing is written), unless ``write_unfit``.
    """
    runtime = runtime_named(runtime_name)
    check_plan(plan, cluster, profile)
    uniform = uniform_structure(plan, profile, cluster, runtime)
    folder = Path(out_dir)
    exported = uniform.plan(plan)
    exported.inputs = _inputs_beside(plan, folder)
    sim = simulate(exported, profile, cluster)
    exported.predicted = sim.predicted()
    unfit = unfit_ranks(uniform, sim)
    if unfit and not write_unfit:
        more = f" (and {len(unfit) - 1} more rank(s))" if len(unfit) > 1 else ""
        raise HetplanError(
            f"the {runtime.title} export does not fit: {unfit[0]}{more}; nothing written (--write-anyway writes it)",
            file=plan.file,
            field="memory",
        )
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

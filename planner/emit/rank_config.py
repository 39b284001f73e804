"""The rank config: everything a rank needs to train its part of a plan, in one YAML file.

Every rank reads the same file and finds itself by its device address (``NODE/INDEX``), so the file
does not depend on the order in which torchrun hands out ranks. It holds the plan's pipelines (each
rank compiles them into the same action lists the simulator timed, and checks them against the
``actions`` written here), the model to build, and the training settings.
"""

from __future__ import annotations

from typing import Any

from planner import __version__
from planner.contracts.cluster import Cluster
from planner.contracts.model_profile import ModelProfile
from planner.contracts.plan import Plan
from planner.schedule.compile import compile_plan

__all__ = ["DEFAULT_LR", "RANK_CONFIG_SCHEMA", "build_rank_config"]

RANK_CONFIG_SCHEMA = "hetplan/rank-config/v1"
#: Learning rates by optimizer when the user gives none: small enough for the zoo's synthetic tasks.
DEFAULT_LR = {"sgd": 0.05, "momentum": 0.02, "adam": 1e-3}


def build_rank_config(
    plan: Plan,
    profile: ModelProfile,
    cluster: Cluster,
    *,
    seed: int = 0,
    lr: float | None = None,
    backend: str = "gloo",
    timeout_s: float = 60.0,
    data: str | None = None,
) -> dict[str, Any]:
    """The rank config of ``plan`` as a plain dict (deterministic key order)."""
    compiled = compile_plan(plan, len(profile.blocks))
    used = set(compiled.programs)
    devices = []
    for d in cluster.devices:
        if d.address not in used:
            continue
        program = compiled.programs[d.address]
        devices.append(
            {
                "address": d.address,
                "node": d.node,
                "type": d.type.name,
                "emulated_slowdown": d.type.slowdown if d.type.emulated else 1.0,
                "pipeline": program.pipeline,
                "stage": program.stage,
                "blocks": [program.start, program.end],
                "actions": program.render(),
            }
        )
    nodes = []
    for node in cluster.nodes:
        here = [d["address"] for d in devices if d["node"] == node.name]
        if here:
            nodes.append({"name": node.name, "devices": here})
    return {
        "schema": RANK_CONFIG_SCHEMA,
        "tool": {"name": "hetplan", "version": __version__},
        "model": profile.model,
        "n_blocks": len(profile.blocks),
        "training": {
            "global_batch": plan.global_batch,
            "schedule": plan.schedule,
            "optimizer": plan.optimizer,
            "dtype": plan.dtype or profile.dtype,
            "lr": lr if lr is not None else DEFAULT_LR[plan.optimizer],
            "seed": seed,
            "backend": backend,
            "timeout_s": timeout_s,
            **({"data": data} if data else {}),
        },
        "pipelines": [p.to_dict() for p in plan.pipelines],
        "world_size": len(devices),
        "nodes": nodes,
        "devices": devices,
        "predicted": {"iteration_s": plan.predicted.get("iteration_s")} if plan.predicted else {},
    }

"""torchtitan: a TOML job config and a torchrun line per node.

    files = RUNTIME.render(uniform, plan, profile, cluster)   # {"torchtitan.toml": ..., "launch.sh": ...}

torchtitan splits a model at module names: ``pipeline_parallel_split_points = ["layers.4"]`` starts
a stage at layer 4, the token embedding staying with the first stage and the final norm and output
with the last (a first stage of the embedding alone is ``"layers.0"``). So stages are whole
transformer layers, of any sizes; a cut between the attention and the MLP of one layer cannot be
said. Data parallelism is replicated (``data_parallel_replicate_degree``, DDP) with sharding off
(``data_parallel_shard_degree = 1``), as hetplan's plans hold whole weights on every replica.
``local_batch_size`` is one replica's batch, split into micro-batches of
``pipeline_parallel_microbatch_size``. Schedules ``1F1B`` and ``GPipe``; optimizers ``Adam`` and
``AdamW`` (no SGD). ``mixed_precision_param`` takes ``bfloat16`` or ``float32`` (no fp16).

The keys are those of ``torchtitan/config/job_config.py`` (pytorch/torchtitan, 2025). torchtitan
renames keys between releases (``batch_size`` became ``local_batch_size``; newer releases describe
stages with ``module_fqns_per_model_part``): check against the release you run (docs/export.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.emit.rank_config import DEFAULT_LR
from hetplan.export.keys import check_documented, undocumented
from hetplan.export.launch import torchrun_script
from hetplan.export.partition import nearest_cuts, transformer_layers
from hetplan.export.structure import Cuts, Runtime, Uniform

__all__ = ["JOB_CONFIG_KEYS", "RUNTIME", "toml_text"]

#: Sections and keys written, from the dataclasses of ``torchtitan/config/job_config.py``
#: (pytorch/torchtitan at commit 000204a: ``Job``, ``Training``, ``Parallelism``, ``Optimizer``).
JOB_CONFIG_KEYS: dict[str, dict[str, type]] = {
    "job": {"description": str},
    "training": {"local_batch_size": int, "global_batch_size": int, "seq_len": int, "mixed_precision_param": str},
    "parallelism": {
        "data_parallel_replicate_degree": int,
        "data_parallel_shard_degree": int,
        "tensor_parallel_degree": int,
        "pipeline_parallel_degree": int,
        "pipeline_parallel_split_points": list,
        "pipeline_parallel_schedule": str,
        "pipeline_parallel_microbatch_size": int,
    },
    "optimizer": {"name": str, "lr": float},
}

_SCHEDULE = {"1f1b": "1F1B", "gpipe": "GPipe"}
_PRECISION = {"bf16": "bfloat16"}  # anything else: float32


def toml_text(sections: dict[str, dict[str, Any]], *, header: str = "") -> str:
    """Sections of strings, numbers, booleans and lists of strings as TOML (the only types written;
    ``json.dumps`` of a string is a valid TOML basic string)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"cannot write {type(v).__name__} as TOML")

    out = [header.rstrip("\n")] if header else []
    for name, keys in sections.items():
        out.append(f"\n[{name}]")
        out.extend(f"{key} = {value(v)}" for key, v in keys.items())
    return "\n".join(out).lstrip("\n") + "\n"


def _max_stages(profile: ModelProfile) -> int:
    """One stage per split point (a layer start after block 0), plus the first."""
    return sum(1 for b in transformer_layers(profile, runtime="torchtitan").starts if b > 0) + 1


def _choose_cuts(profile: ModelProfile, stages: int, reference: tuple[int, ...]) -> Cuts:
    """The nearest cut at layer starts (any stage sizes)."""
    layout = transformer_layers(profile, runtime="torchtitan")
    bounds = tuple(nearest_cuts(reference, layout.starts, 0, layout.blocks))
    layer_of = {b: k for k, b in enumerate(layout.starts)}
    split_points = [f"layers.{layer_of[b]}" for b in bounds[1:-1]]
    note = ""
    if bounds != reference:
        inside = [b for b in reference[1:-1] if b not in layer_of]
        why = f"block(s) {inside} fall inside a layer or beside the head; " if inside else ""
        note = f"{why}torchtitan splits at whole layers: {split_points}"
    return Cuts(bounds=bounds, settings={"split_points": split_points}, note=note)


def _job_config(u: Uniform, plan: Plan, profile: ModelProfile) -> dict[str, dict[str, Any]]:
    config = profile.model.get("config", {}) if isinstance(profile.model, dict) else {}
    training: dict[str, Any] = {
        "local_batch_size": u.global_batch // u.replicas,
        "global_batch_size": u.global_batch,
    }
    if "seq" in config:
        training["seq_len"] = config["seq"]
    training["mixed_precision_param"] = _PRECISION.get(plan.dtype or profile.dtype, "float32")
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": u.replicas,
        "data_parallel_shard_degree": 1,
        "tensor_parallel_degree": 1,
        "pipeline_parallel_degree": u.stages,
    }
    if u.stages > 1:
        parallelism["pipeline_parallel_split_points"] = u.settings["split_points"]
        parallelism["pipeline_parallel_schedule"] = _SCHEDULE[u.schedule]
        parallelism["pipeline_parallel_microbatch_size"] = u.micro_batch
    return {
        "job": {"description": f"hetplan export of {Path(plan.file).name if plan.file else 'a plan'}"},
        "training": training,
        "parallelism": parallelism,
        "optimizer": {"name": "Adam", "lr": DEFAULT_LR[u.optimizer]},
    }


def _render(u: Uniform, plan: Plan, profile: ModelProfile, cluster: Cluster) -> dict[str, str]:
    header = (
        "# Written by hetplan export torchtitan. Set [model] name and flavor to your torchtitan model whose\n"
        "# layers.N are this profile's transformer layers; add the dataset and the number of steps.\n"
    )
    launch_header = (
        f"# Written by hetplan export torchtitan: rank r runs pipeline stage r // {u.replicas} (torchtitan's\n"
        "# device mesh [pp, dp_replicate, ...]); ranks are numbered node by node, in this file's order.\n"
    )
    config = _job_config(u, plan, profile)
    check_documented(undocumented(config, JOB_CONFIG_KEYS), runtime="torchtitan", file="torchtitan.toml")
    return {
        "torchtitan.toml": toml_text(config, header=header),
        "launch.sh": torchrun_script(u, "-m torchtitan.train --job.config_file torchtitan.toml", header=launch_header),
    }


def _notes(plan: Plan, profile: ModelProfile) -> list[str]:
    dtype = plan.dtype or profile.dtype
    if dtype in ("fp16", "tf32"):
        return [f"dtype {dtype}: torchtitan's mixed_precision_param takes bfloat16 or float32; written float32"]
    return []


RUNTIME = Runtime(
    name="torchtitan",
    title="torchtitan",
    doc="torchtitan/config/job_config.py of https://github.com/pytorch/torchtitan",
    schedules=("1f1b", "gpipe"),
    optimizers=("adam",),
    max_stages=_max_stages,
    choose_cuts=_choose_cuts,
    render=_render,
    notes=_notes,
)

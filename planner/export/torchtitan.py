"""torchtitan 0.3.0: a config-registry module of the plan and one torchrun script a node.

    files = RUNTIME.render(uniform, plan, profile, cluster)   # {"hetplan_torchtitan.py": ..., "node-n0.sh": ...}

torchtitan 0.3.0 has no TOML input: a job is ``--module M --config F``, where ``F`` is a function of
the module ``M`` returning a ``Trainer.Config`` (its "config registry"), with ``--section.key``
overrides parsed by tyro (``torchtitan/config/manager.py``). The export writes such a module,
``hetplan_torchtitan.py``, whose function ``hetplan_export`` starts from the user's model config
(``HETPLAN_TITAN_MODULE`` and ``HETPLAN_TITAN_CONFIG``, by default llama3's ``llama3_8b``) and sets
what the plan decides; the node scripts run ``-m torchtitan.train --module hetplan_torchtitan
--config hetplan_export``. Stages are ``parallelism.module_fqns_per_model_part``: lists of module
names (``tok_embeddings``, ``layers.N``, ``norm``, ``lm_head``), so a stage is whole transformer
layers of any count, the embedding may stand alone and so may the output; a cut between the
attention and the MLP of one layer cannot be said.

Kept: tensor parallelism (``tensor_parallel_degree``), activation checkpointing (``FullAC`` /
``SelectiveAC``, or none), the pipeline schedule (``1F1B`` or ``GPipe``) and micro-batch size, the
optimizer (torchtitan builds ``Adam`` and ``AdamW`` only) with every setting explicit, no gradient
clipping (``max_norm`` infinite). Data parallelism is replicated (``data_parallel_replicate_degree``,
``data_parallel_shard_degree = 1``: llama3's ``parallelize`` applies FSDP2 over
``[dp_replicate, fsdp]``, a shard degree of 1 keeping whole weights on every replica, as hetplan's
plans); where the plan shards the optimizer state (ZeRO-1), the replicas become FSDP shards instead
(``data_parallel_shard_degree = D``), which shards parameters and gradients too: less memory than
the exported plan is simulated with, and parameter all-gathers it does not price (docs/export.md).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.emit.rank_config import DEFAULT_LR
from hetplan.export.keys import check_documented, undocumented
from hetplan.export.launch import node_scripts
from hetplan.export.partition import nearest_cuts, transformer_layers
from hetplan.export.structure import Cuts, Runtime, Uniform

__all__ = ["CONFIG_FUNCTION", "CONFIG_MODULE", "JOB_CONFIG_KEYS", "RUNTIME", "VERSION", "job_settings", "stage_modules"]

VERSION = "0.3.0"
CONFIG_MODULE = "hetplan_torchtitan"
CONFIG_FUNCTION = "hetplan_export"

#: ``Trainer.Config`` fields written, from torchtitan 0.3.0 (``torchtitan/config/configs.py``:
#: ``TrainingConfig``, ``ParallelismConfig``; ``torchtitan/trainer.py``: ``activation_checkpoint``;
#: ``torchtitan/components/optimizer/optimizer.py``: ``ParamGroupConfig``).
JOB_CONFIG_KEYS: dict[str, Any] = {
    "training": {
        "local_batch_size": int,
        "global_batch_size": int,
        "seq_len": int,
        "mixed_precision_param": str,
        "max_norm": float,
        "disable_cuda_graphs": bool,
    },
    "parallelism": {
        "data_parallel_replicate_degree": int,
        "data_parallel_shard_degree": int,
        "tensor_parallel_degree": int,
        "pipeline_parallel_degree": int,
        "module_fqns_per_model_part": list,
        "pipeline_parallel_schedule": str,
        "pipeline_parallel_microbatch_size": int,
    },
    "activation_checkpoint": str,  # FullAC, SelectiveAC or none
    "optimizer": {"name": str, "lr": float, "betas": list, "eps": float, "weight_decay": float},
}

_SCHEDULE = {"1f1b": "1F1B", "gpipe": "GPipe"}
_PRECISION = {"bf16": "bfloat16"}  # anything else: float32
_OPTIMIZER = {
    "adam": ("Adam", {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}),
    "adamw": ("AdamW", {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}),
}
_AC = {"none": "none", "full": "FullAC", "selective": "SelectiveAC"}


def _candidates(profile: ModelProfile) -> list[int]:
    layout = transformer_layers(profile, runtime="torchtitan")
    return sorted({b for b in layout.starts if b > 0} | ({layout.end} if layout.end < layout.blocks else set()))


def _max_stages(profile: ModelProfile) -> int:
    """One stage per whole-layer boundary, plus the first."""
    return len(_candidates(profile)) + 1


def _choose_cuts(profile: ModelProfile, stages: int, reference: tuple[int, ...]) -> Cuts:
    """The nearest cut at whole layers (any stage sizes)."""
    layout = transformer_layers(profile, runtime="torchtitan")
    bounds = tuple(nearest_cuts(reference, _candidates(profile), 0, layout.blocks))
    note = ""
    if bounds != reference:
        inside = [b for b in reference[1:-1] if b not in _candidates(profile)]
        why = f"block(s) {inside} fall inside a layer; " if inside else ""
        per_stage = [sum(m.startswith("layers.") for m in part) for part in stage_modules(profile, bounds)]
        note = f"{why}torchtitan stages are whole layers: {', '.join(map(str, per_stage))} layers per stage"
    return Cuts(bounds=bounds, settings={"modules": stage_modules(profile, bounds)}, note=note)


def stage_modules(profile: ModelProfile, bounds: tuple[int, ...]) -> list[list[str]]:
    """``module_fqns_per_model_part`` of a cut: each stage's module names in torchtitan's models."""
    layout = transformer_layers(profile, runtime="torchtitan")
    out = []
    for k in range(len(bounds) - 1):
        names = ["tok_embeddings"] if k == 0 else []
        names += [f"layers.{i}" for i, b in enumerate(layout.starts) if bounds[k] <= b < bounds[k + 1]]
        out.append(names + (["norm", "lm_head"] if k == len(bounds) - 2 else []))
    return out


def job_settings(u: Uniform, plan: Plan, profile: ModelProfile) -> dict[str, Any]:
    """What ``hetplan_export`` sets on the base ``Trainer.Config``, section by section."""
    config = profile.model.get("config", {}) if isinstance(profile.model, dict) else {}
    training: dict[str, Any] = {"local_batch_size": u.global_batch // u.replicas, "global_batch_size": u.global_batch}
    if "seq" in config:
        training["seq_len"] = config["seq"]
    training["mixed_precision_param"] = _PRECISION.get(plan.dtype or profile.dtype, "float32")
    training["max_norm"] = math.inf  # hetplan's plans do not clip
    if u.stages > 1:  # 0.3.0's Trainer.Config refuses CUDA graphs with pipeline parallelism
        training["disable_cuda_graphs"] = True
    sharded = bool(u.zero) and u.replicas > 1
    parallelism: dict[str, Any] = {
        "data_parallel_replicate_degree": 1 if sharded else u.replicas,
        "data_parallel_shard_degree": u.replicas if sharded else 1,
        "tensor_parallel_degree": u.tensor_parallel,
        "pipeline_parallel_degree": u.stages,
    }
    if u.stages > 1:
        parallelism["module_fqns_per_model_part"] = u.settings["modules"]
        parallelism["pipeline_parallel_schedule"] = _SCHEDULE[u.schedule]
        parallelism["pipeline_parallel_microbatch_size"] = u.micro_batch
    name, extra = _OPTIMIZER[u.optimizer]
    return {
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": _AC[u.recompute],
        "optimizer": {"name": name, "lr": DEFAULT_LR[u.optimizer], **extra},
    }


_MODULE = '''"""Written by hetplan export torchtitan ({source}): torchtitan {version}'s config registry for this plan.

Run: torchrun ... -m torchtitan.train --module {module} --config {function}
(this folder on PYTHONPATH; the node scripts set it). The model is the user's: HETPLAN_TITAN_MODULE
and HETPLAN_TITAN_CONFIG name a torchtitan config registry and function whose model's layers.N are
the profile's transformer layers (default: llama3's llama3_8b). Add the dataset and the steps there
or as --section.key overrides.
"""

import importlib
import os

from torchtitan.components.optimizer.optimizer import OptimizersContainer, ParamGroupConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC

SETTINGS = {settings}


def {function}():
    base = importlib.import_module(os.environ.get("HETPLAN_TITAN_MODULE", "torchtitan.models.llama3.config_registry"))
    config = getattr(base, os.environ.get("HETPLAN_TITAN_CONFIG", "llama3_8b"))()
    for section in ("training", "parallelism"):
        for key, value in SETTINGS[section].items():
            setattr(getattr(config, section), key, value)
    config.activation_checkpoint = {{"FullAC": FullAC.Config, "SelectiveAC": SelectiveAC.Config}}.get(
        SETTINGS["activation_checkpoint"], lambda: None
    )()
    optimizer = dict(SETTINGS["optimizer"])
    name = optimizer.pop("name")
    optimizer["betas"] = tuple(optimizer["betas"])
    config.optimizer = OptimizersContainer.Config(
        param_groups=[ParamGroupConfig(pattern=".*", optimizer_name=name, optimizer_kwargs=optimizer)]
    )
    config.__post_init__()  # torchtitan's own checks of the combination (batch and micro-batch sizes)
    return config
'''


def _render(u: Uniform, plan: Plan, profile: ModelProfile, cluster: Cluster) -> dict[str, str]:
    settings = job_settings(u, plan, profile)
    check_documented(undocumented(settings, JOB_CONFIG_KEYS), runtime="torchtitan", file=f"{CONFIG_MODULE}.py")
    source = Path(plan.file).name if plan.file else "a plan"
    text = _MODULE.format(
        source=source,
        version=VERSION,
        module=CONFIG_MODULE,
        function=CONFIG_FUNCTION,
        settings=re.sub(r"(?<![\w'\"])inf(?![\w'\"])", 'float("inf")', repr(settings)),
    )
    header = (
        f"# Written by hetplan export torchtitan: rank r runs pipeline stage r // {u.replicas * u.tensor_parallel}\n"
        "# (torchtitan's mesh [pp, dp_replicate, dp_shard, cp, tp]); ranks are numbered node by node.\n"
        "# Run every node's script at the same time.\n"
    )
    env = {"PYTHONPATH": '"$PWD${PYTHONPATH:+:$PYTHONPATH}"'}
    command = f"-m torchtitan.train --module {CONFIG_MODULE} --config {CONFIG_FUNCTION}"
    return {f"{CONFIG_MODULE}.py": text, **node_scripts(u, command, header=header, env=env)}


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
    optimizers=("adam", "adamw"),
    max_stages=_max_stages,
    choose_cuts=_choose_cuts,
    render=_render,
    notes=_notes,
    tensor_parallel=True,
    recompute=("none", "selective", "full"),
    zero=True,
)

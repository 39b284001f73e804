"""DeepSpeed: ``ds_config.json``, the ``PipelineModule`` settings and one launch script a node.

    files = RUNTIME.render(uniform, plan, profile, cluster)   # {"ds_config.json": ..., ...}

DeepSpeed's pipeline engine runs ``PipelineModule(layers, num_stages=S, partition_method=...)``
replicated over the remaining ranks. Its layers are taken to be the profile's blocks, one
``LayerSpec`` per block (the user's model code builds that list). DeepSpeed cuts them itself:
``partition_method`` is ``"uniform"`` (equal layer counts), ``"parameters"`` (balanced parameter
counts) or ``"type:REGEX"`` (balanced counts of matching layer classes); it takes no explicit
boundary list. The export picks whichever of ``uniform`` and ``parameters`` lands nearest hetplan's
cut (``type:`` depends on the user's class names) and writes the boundaries it produces, which the
exported plan uses; hetplan's own boundaries are written beside them (``hetplan_parts``) for a user
who overrides ``PipelineModule._partition_layers``, a private method. Its pipeline schedule
(``TrainSchedule``) is 1F1B-like; GPipe is not offered. Kept where the plan has them: ZeRO-1
(``zero_optimization.stage 1``: DeepSpeed's pipeline engine takes stage 0 or 1) and full
recomputation (``activation_checkpoint_interval 1``: every layer's input kept, the layer run again in
backward; selective recomputation becomes full). The optimizer is the plan's, with every setting
explicit (DeepSpeed's ``Adam`` is AdamW unless ``adam_w_mode`` is false; no gradient clipping). Ranks
are started by torchrun, one script a node (:mod:`hetplan.export.launch`): ``deepspeed.initialize``
reads torchrun's environment, and torchrun orders a node's devices as listed.
"""

from __future__ import annotations

import json
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.emit.rank_config import DEFAULT_LR
from hetplan.export.keys import check_documented, undocumented
from hetplan.export.launch import node_scripts
from hetplan.export.partition import cut_distance, deepspeed_parameters, deepspeed_uniform
from hetplan.export.structure import Cuts, Runtime, Uniform

__all__ = ["DS_CONFIG_KEYS", "PIPELINE_MODULE_ARGS", "RUNTIME", "TOPOLOGY_ARGS", "pipeline_module_args"]

#: ``ds_config.json`` keys this export writes, nested as written, from DeepSpeed's configuration
#: reference https://www.deepspeed.ai/docs/config-json/ (batch size, optimizer, fp16, bf16,
#: ZeRO and logging sections). ``optimizer.params`` takes the optimizer's own keyword arguments:
#: DeepSpeed builds ``Adam`` itself and imports other names (``SGD``) from ``torch.optim``.
DS_CONFIG_KEYS: dict[str, Any] = {
    "train_batch_size": int,
    "train_micro_batch_size_per_gpu": int,
    "gradient_accumulation_steps": int,
    "optimizer": {
        "type": str,
        "params": {
            "lr": float,
            "betas": list,
            "eps": float,
            "weight_decay": float,
            "adam_w_mode": bool,
            "momentum": float,
        },
    },
    "gradient_clipping": float,
    "fp16": {"enabled": bool, "loss_scale": float},
    "bf16": {"enabled": bool},
    "zero_optimization": {"stage": int},
    "steps_per_print": int,
}

#: Arguments of ``deepspeed.pipe.PipelineModule`` and ``deepspeed.runtime.pipe.topology.
#: PipeDataParallelTopology``, from https://deepspeed.readthedocs.io/en/latest/pipeline.html.
PIPELINE_MODULE_ARGS = frozenset(
    {
        "layers",
        "num_stages",
        "topology",
        "loss_fn",
        "seed_layers",
        "seed_fn",
        "base_seed",
        "partition_method",
        "activation_checkpoint_interval",
        "activation_checkpoint_func",
        "checkpointable_layers",
    }
)
TOPOLOGY_ARGS = frozenset({"num_pp", "num_dp"})

#: The optimizer of each hetplan optimizer, every setting explicit (torch's defaults; hetplan's
#: ``adamw`` decays weights by 0.01, as its own runtime, docs/runtime.md). DeepSpeed builds ``Adam``
#: and ``AdamW`` itself and takes other names from ``torch.optim`` (``SGD``).
_ADAM = {"betas": [0.9, 0.999], "eps": 1e-8}
_OPTIMIZER: dict[str, tuple[str, dict[str, Any]]] = {
    "adam": ("Adam", {**_ADAM, "weight_decay": 0.0, "adam_w_mode": False}),
    "adamw": ("AdamW", {**_ADAM, "weight_decay": 0.01}),
    "sgd": ("SGD", {"momentum": 0.0, "weight_decay": 0.0}),
    "momentum": ("SGD", {"momentum": 0.9, "weight_decay": 0.0}),
}


def _choose_cuts(profile: ModelProfile, stages: int, reference: tuple[int, ...]) -> Cuts:
    """The nearer to ``reference`` of DeepSpeed's ``parameters`` and ``uniform`` partitions
    (``parameters``, DeepSpeed's usual choice, on a tie)."""
    n = len(profile.blocks)
    options = {
        # DeepSpeed counts a tied layer's parameters in every layer holding it (each builds the module)
        "parameters": tuple(
            deepspeed_parameters([profile.block_params(i)[0] for i in range(len(profile.blocks))], stages)
        ),
        "uniform": tuple(deepspeed_uniform(n, stages)),
    }
    method = min(options, key=lambda k: (cut_distance(options[k], reference), k != "parameters"))
    bounds = options[method]
    note = ""
    if bounds != reference:
        note = (
            f'partition_method="{method}"; DeepSpeed takes no explicit boundaries, so hetplan\'s '
            f"{list(reference)} needs a PipelineModule subclass (pipeline.json: hetplan_parts)"
        )
    return Cuts(bounds=bounds, settings={"partition_method": method, "hetplan_parts": list(reference)}, note=note)


def _ds_config(u: Uniform, plan: Plan, profile: ModelProfile) -> dict[str, Any]:
    name, extra = _OPTIMIZER[u.optimizer]
    config: dict[str, Any] = {
        "train_batch_size": u.global_batch,
        "train_micro_batch_size_per_gpu": u.micro_batch,
        "gradient_accumulation_steps": u.micro_batches,
        "optimizer": {"type": name, "params": {"lr": DEFAULT_LR[u.optimizer], **extra}},
        "gradient_clipping": 0.0,  # hetplan's plans do not clip
    }
    dtype = plan.dtype or profile.dtype
    if dtype == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}  # 0: dynamic loss scaling
    elif dtype == "bf16":
        config["bf16"] = {"enabled": True}
    config["zero_optimization"] = {"stage": u.zero}  # 1: optimizer state sharded over the replicas
    config["steps_per_print"] = 10
    return config


def pipeline_module_args(u: Uniform) -> dict[str, Any]:
    """``PipelineModule`` keyword arguments (besides ``layers``, ``topology`` and ``loss_fn``)."""
    return {
        "num_stages": u.stages,
        "partition_method": u.settings["partition_method"],
        "activation_checkpoint_interval": 1 if u.recompute == "full" else 0,
    }


def _render(u: Uniform, plan: Plan, profile: ModelProfile, cluster: Cluster) -> dict[str, str]:
    pipeline = {
        "PipelineModule": pipeline_module_args(u),
        "PipeDataParallelTopology": {"num_pp": u.stages, "num_dp": u.replicas},
        "parts": list(u.cuts),
        "hetplan_parts": u.settings["hetplan_parts"],
        "layers": [b.name for b in profile.blocks],
    }
    header = (
        f"# Written by hetplan export deepspeed: rank r runs pipeline stage r // {u.replicas}\n"
        "# (PipeDataParallelTopology, axes pipe, data); ranks are numbered node by node, in node-rank order.\n"
        "# TRAIN_SCRIPT builds PipelineModule(layers=<one LayerSpec per block of pipeline.json>, topology=\n"
        "# PipeDataParallelTopology(**pipeline.json's), **pipeline.json's PipelineModule) and calls\n"
        "# deepspeed.initialize(config='ds_config.json'). Run every node's script at the same time.\n"
    )
    config = _ds_config(u, plan, profile)
    check_documented(undocumented(config, DS_CONFIG_KEYS), runtime="deepspeed", file="ds_config.json")
    problems = [f"PipelineModule.{k}" for k in pipeline["PipelineModule"] if k not in PIPELINE_MODULE_ARGS]
    problems += [
        f"PipeDataParallelTopology.{k}" for k in pipeline["PipeDataParallelTopology"] if k not in TOPOLOGY_ARGS
    ]
    check_documented(problems, runtime="deepspeed", file="pipeline.json")
    command = '"${TRAIN_SCRIPT:-train.py}" --deepspeed --deepspeed_config ds_config.json'
    return {
        "ds_config.json": json.dumps(config, indent=2) + "\n",
        "pipeline.json": json.dumps(pipeline, indent=2) + "\n",
        **node_scripts(u, command, header=header),
    }


def _notes(plan: Plan, profile: ModelProfile) -> list[str]:
    if (plan.dtype or profile.dtype) == "tf32":
        return [
            "dtype tf32: ds_config.json has no TF32 switch; set torch.backends.cuda.matmul.allow_tf32 in the script"
        ]
    return []


RUNTIME = Runtime(
    name="deepspeed",
    title="DeepSpeed",
    doc="https://www.deepspeed.ai/docs/config-json/ and https://deepspeed.readthedocs.io/en/latest/pipeline.html",
    schedules=("1f1b",),
    optimizers=("adam", "adamw", "sgd", "momentum"),
    max_stages=lambda profile: len(profile.blocks),
    choose_cuts=_choose_cuts,
    render=_render,
    notes=_notes,
    recompute=("none", "full"),
    zero=True,
)

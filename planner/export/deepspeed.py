"""DeepSpeed: ``ds_config.json``, the ``PipelineModule`` settings, a hostfile and the launcher line.

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
(``TrainSchedule``) is 1F1B-like; GPipe is not offered. Its launcher numbers ranks host by host in
hostfile order and, within a host, by device index (``--include`` is read as a set).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.emit.rank_config import DEFAULT_LR
from hetplan.export.keys import check_documented, undocumented
from hetplan.export.launch import MASTER_PORT
from hetplan.export.partition import cut_distance, deepspeed_parameters, deepspeed_uniform
from hetplan.export.structure import Cuts, Runtime, Uniform

__all__ = ["DS_CONFIG_KEYS", "LAUNCHER_FLAGS", "PIPELINE_MODULE_ARGS", "RUNTIME", "TOPOLOGY_ARGS"]

#: ``ds_config.json`` keys this export writes, nested as written, from DeepSpeed's configuration
#: reference https://www.deepspeed.ai/docs/config-json/ (batch size, optimizer, fp16, bf16,
#: ZeRO and logging sections). ``optimizer.params`` takes the optimizer's own keyword arguments:
#: DeepSpeed builds ``Adam`` itself and imports other names (``SGD``) from ``torch.optim``.
DS_CONFIG_KEYS: dict[str, Any] = {
    "train_batch_size": int,
    "train_micro_batch_size_per_gpu": int,
    "gradient_accumulation_steps": int,
    "optimizer": {"type": str, "params": {"lr": float, "momentum": float}},
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

#: The ``deepspeed`` launcher's flags used, from https://www.deepspeed.ai/getting-started/
#: ("Resource Configuration (multi-node)") and ``deepspeed --help``.
LAUNCHER_FLAGS = frozenset({"--hostfile", "--include", "--master_addr", "--master_port"})

_OPTIMIZER = {"adam": ("Adam", {}), "adamw": ("AdamW", {}), "sgd": ("SGD", {}), "momentum": ("SGD", {"momentum": 0.9})}


def _choose_cuts(profile: ModelProfile, stages: int, reference: tuple[int, ...]) -> Cuts:
    """The nearer to ``reference`` of DeepSpeed's ``parameters`` and ``uniform`` partitions
    (``parameters``, DeepSpeed's usual choice, on a tie)."""
    n = len(profile.blocks)
    options = {
        "parameters": tuple(deepspeed_parameters([float(b.params) for b in profile.blocks], stages)),
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
    }
    dtype = plan.dtype or profile.dtype
    if dtype == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}  # 0: dynamic loss scaling
    elif dtype == "bf16":
        config["bf16"] = {"enabled": True}
    config["zero_optimization"] = {"stage": 0}  # optimizer state replicated, as hetplan's plans (zero: 0)
    config["steps_per_print"] = 10
    return config


def _render(u: Uniform, plan: Plan, profile: ModelProfile, cluster: Cluster) -> dict[str, str]:
    nodes = u.nodes()
    pipeline = {
        "PipelineModule": {"num_stages": u.stages, "partition_method": u.settings["partition_method"]},
        "PipeDataParallelTopology": {"num_pp": u.stages, "num_dp": u.replicas},
        "parts": list(u.cuts),
        "hetplan_parts": u.settings["hetplan_parts"],
        "layers": [b.name for b in profile.blocks],
    }
    hostfile = "".join(f"{node} slots={len(cluster.node(node).devices)}\n" for node, _ in nodes)
    include = "@".join(f"{node}:{','.join(map(str, indices))}" for node, indices in nodes)
    launch = (
        "#!/usr/bin/env bash\n"
        "# Written by hetplan export deepspeed: ranks are numbered node by node in hostfile order,\n"
        f"# rank r runs pipeline stage r // {u.replicas} (PipeDataParallelTopology, axes pipe, data).\n"
        "# TRAIN_SCRIPT builds PipelineModule(layers=<one LayerSpec per block of pipeline.json>, num_stages,\n"
        "# partition_method) from pipeline.json and calls deepspeed.initialize(config='ds_config.json').\n"
        'cd "$(dirname "$0")"\n'
        f"deepspeed --hostfile hostfile --include {shlex.quote(include)} --master_addr {nodes[0][0]} "
        f'--master_port {MASTER_PORT} "${{TRAIN_SCRIPT:-train.py}}" --deepspeed --deepspeed_config ds_config.json\n'
    )
    config = _ds_config(u, plan, profile)
    check_documented(undocumented(config, DS_CONFIG_KEYS), runtime="deepspeed", file="ds_config.json")
    problems = [f"PipelineModule.{k}" for k in pipeline["PipelineModule"] if k not in PIPELINE_MODULE_ARGS]
    problems += [
        f"PipeDataParallelTopology.{k}" for k in pipeline["PipeDataParallelTopology"] if k not in TOPOLOGY_ARGS
    ]
    check_documented(problems, runtime="deepspeed", file="pipeline.json")
    return {
        "ds_config.json": json.dumps(config, indent=2) + "\n",
        "pipeline.json": json.dumps(pipeline, indent=2) + "\n",
        "hostfile": hostfile,
        "launch.sh": launch,
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
    orders_devices=False,  # its launcher takes a node's devices from --include as a set (by index)
)

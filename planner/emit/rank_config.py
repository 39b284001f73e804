"""The rank config: everything a rank needs to train its part of a plan, in one YAML file.

Every rank reads the same file and finds itself by its device address (``NODE/INDEX``), so the file
does not depend on the order in which torchrun hands out ranks. It holds the plan's pipelines (each
rank compiles them into the same action lists the simulator timed, and checks them against the
``actions`` written here), the model to build, and the training settings.

Everything a run needs beyond the plan travels in ``training`` (so the worker needs no flag of its
own): the optimizer (the plan's, or an override such as ``adamw``), AdamW's weight decay, the
maximum global gradient norm, the learning-rate schedule, and the data (a text file, or a user's
dataset module with its keyword arguments), and the plan's ``zero`` (1: ZeRO-1 sharded optimizer
state). Each stage's ``tensor_parallel`` and ``recompute`` travel in ``pipelines`` (the plan
contract's own stage format). Keys left out mean today's behaviour.
"""

from __future__ import annotations

from typing import Any

from hetplan import __version__
from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.contracts.rank_config import RANK_CONFIG_SCHEMA
from hetplan.errors import HetplanError
from hetplan.schedule.compile import compile_plan

__all__ = ["DEFAULT_LR", "RANK_CONFIG_SCHEMA", "build_rank_config"]

#: Learning rates by optimizer when the user gives none: small enough for the zoo's synthetic tasks.
DEFAULT_LR = {"sgd": 0.05, "momentum": 0.02, "adam": 1e-3, "adamw": 1e-3}


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
    optimizer: str | None = None,
    weight_decay: float | None = None,
    clip_grad_norm: float | None = None,
    warmup_steps: int = 0,
    decay_steps: int = 0,
    min_lr: float = 0.0,
    dataset: str | None = None,
    dataset_kwargs: dict[str, Any] | None = None,
    compute_device: str | None = None,
    accept_device_mismatch: bool = False,
    init_from: str | None = None,
) -> dict[str, Any]:
    """The rank config of ``plan`` as a plain dict (deterministic key order).

    Args:
        optimizer: the optimizer the ranks step, overriding the plan's (e.g. ``adamw``).
        weight_decay: AdamW's decoupled weight decay (written for ``adamw`` only; default 0.01).
        clip_grad_norm: clip the whole model's gradient to this 2-norm (None: no clipping).
        warmup_steps, decay_steps, min_lr: linear warm-up from 0 to ``lr``, then cosine decay to
            ``min_lr`` (:mod:`hetplan.contracts.lr_schedule`); all 0: a constant ``lr``.
        data: a text file (a character-level language model).
        dataset, dataset_kwargs: a user's ``module:function`` returning a map-style dataset, and
            its keyword arguments.
        compute_device: ``cuda`` or ``cpu`` (None: cuda under nccl, cpu under gloo); ``cuda`` with
            backend gloo is the host-staged transport (:mod:`hetplan.runtime.device.staged`).
        accept_device_mismatch: a rank whose GPU is not its device's type goes on (with a warning).
        init_from: weights the ranks start from (a ``save_pretrained`` folder or a state_dict file),
            written as given: each rank reads its own blocks' tensors from it.
    """
    name = optimizer or plan.optimizer
    if name not in DEFAULT_LR:
        raise HetplanError(f"expected one of {', '.join(DEFAULT_LR)}, got {name!r}", field="--optimizer")
    rate = lr if lr is not None else DEFAULT_LR[name]
    if data and dataset:
        raise HetplanError("give --data (a text file) or --dataset (a module), not both", field="--dataset")
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
                "memory": d.type.memory,  # a GPU rank checks its GPU against it
                **({"slowdown_changes": [list(c) for c in d.type.slowdown_changes]} if d.type.slowdown_changes else {}),
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
            "optimizer": name,
            "dtype": plan.dtype or profile.dtype,
            "lr": rate,
            "seed": seed,
            "backend": backend,
            "timeout_s": timeout_s,
            **({"data": data} if data else {}),
            **({"compute_device": compute_device} if compute_device else {}),
            **({"accept_device_mismatch": True} if accept_device_mismatch else {}),
            **({"init_from": str(init_from)} if init_from else {}),
            **({"zero": plan.zero} if plan.zero else {}),
            **({"sync": plan.sync, "sync_options": dict(plan.sync_options)} if plan.sync != "allreduce" else {}),
            **_training_options(
                name,
                rate,
                weight_decay=weight_decay,
                clip_grad_norm=clip_grad_norm,
                warmup_steps=warmup_steps,
                decay_steps=decay_steps,
                min_lr=min_lr,
                dataset=dataset,
                dataset_kwargs=dataset_kwargs,
            ),
        },
        "pipelines": [p.to_dict() for p in plan.pipelines],
        # wsp and sdpipe add one process, the central role (hetplan.runtime.sync.central), on the first node
        "world_size": len(devices) + (1 if plan.sync in ("wsp", "sdpipe") else 0),
        **({"central": {"node": nodes[0]["name"]}} if plan.sync in ("wsp", "sdpipe") else {}),
        "nodes": nodes,
        **_emulated_links(cluster, [n["name"] for n in nodes]),
        "devices": devices,
        "predicted": {"iteration_s": plan.predicted.get("iteration_s")} if plan.predicted else {},
    }


def _emulated_links(cluster: Cluster, nodes: list[str]) -> dict[str, Any]:
    """``emulated_links``: the links between (or inside) the used nodes that the cluster marks
    ``emulate: true``, for the ranks to pace their transfers and collectives by (emulation)."""
    out = []
    for i, a in enumerate(nodes):
        for b in nodes[i:]:
            link = cluster.link(f"{a}/0", f"{b}/0")  # the link between the two nodes (or inside one)
            if link.emulated:
                out.append({"nodes": [a, b], "bandwidth": link.bandwidth, "latency": link.latency})
    return {"emulated_links": out} if out else {}


def _training_options(
    optimizer: str,
    lr: float,
    *,
    weight_decay: float | None,
    clip_grad_norm: float | None,
    warmup_steps: int,
    decay_steps: int,
    min_lr: float,
    dataset: str | None,
    dataset_kwargs: dict[str, Any] | None,
) -> dict[str, Any]:
    """The optional ``training`` keys, only those that differ from today's behaviour."""
    out: dict[str, Any] = {}
    if weight_decay is not None:  # absent: the runtime's default (0.01, torch's AdamW's)
        if optimizer != "adamw":
            raise HetplanError(
                f"--weight-decay is AdamW's; this run's optimizer is {optimizer}", field="--weight-decay"
            )
        out["weight_decay"] = weight_decay
    if clip_grad_norm is not None:
        out["clip_grad_norm"] = clip_grad_norm
    if min_lr > lr:
        raise HetplanError(f"the floor {min_lr:g} is above the learning rate {lr:g}", field="--min-lr")
    if warmup_steps or decay_steps:
        out["lr_schedule"] = {"warmup_steps": warmup_steps, "decay_steps": decay_steps, "min_lr": min_lr}
    elif min_lr:
        raise HetplanError("--min-lr needs a decay (--decay-steps)", field="--min-lr")
    if dataset:
        out["dataset"] = dataset
        if dataset_kwargs:
            out["dataset_kwargs"] = dict(dataset_kwargs)
    elif dataset_kwargs:
        raise HetplanError("--dataset-kwargs without --dataset", field="--dataset-kwargs")
    return out

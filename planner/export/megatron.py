"""Megatron-LM: the ``pretrain_gpt.py`` command-line arguments and a torchrun line per node.

    files = RUNTIME.render(uniform, plan, profile, cluster)   # {"megatron-args.txt": ..., "launch.sh": ...}

Megatron-LM pipelines transformer layers: the embedding rides with the first stage, the final norm
and output layer with the last, and ``--num-layers`` layers are split evenly over
``--pipeline-model-parallel-size`` stages, or unevenly with ``--decoder-first-pipeline-num-layers``
and ``--decoder-last-pipeline-num-layers`` (the rest split evenly over the middle stages; Megatron
Core 0.9 and later). A cut between the attention and the MLP of one layer, or a middle that does
not split evenly, cannot be said: the export takes the nearest cut of that form. The data-parallel
size is what is left (``world size / (tensor x pipeline)``), the micro-batch count
``global batch / (micro-batch x data-parallel)``. Its schedule is 1F1B (GPipe is not offered).
"""

from __future__ import annotations

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.emit.rank_config import DEFAULT_LR
from hetplan.export.keys import check_documented
from hetplan.export.launch import torchrun_script
from hetplan.export.partition import TransformerLayers, cut_distance, transformer_layers
from hetplan.export.structure import Cuts, Runtime, Uniform

__all__ = ["ARGUMENTS", "RUNTIME", "parse_arguments"]

#: Arguments this export writes, as ``megatron/training/arguments.py`` of NVIDIA/Megatron-LM
#: defines them (``_add_network_size_args``, ``_add_distributed_args``, ``_add_training_args``,
#: ``_add_mixed_precision_args``, ``_add_learning_rate_args``): name -> takes a value.
ARGUMENTS: dict[str, bool] = {
    "--num-layers": True,
    "--hidden-size": True,
    "--num-attention-heads": True,
    "--seq-length": True,
    "--max-position-embeddings": True,
    "--untie-embeddings-and-output-weights": False,
    "--tensor-model-parallel-size": True,
    "--pipeline-model-parallel-size": True,
    "--decoder-first-pipeline-num-layers": True,
    "--decoder-last-pipeline-num-layers": True,
    "--micro-batch-size": True,
    "--global-batch-size": True,
    "--fp16": False,
    "--bf16": False,
    "--optimizer": True,
    "--sgd-momentum": True,
    "--lr": True,
    "--recompute-granularity": True,
    "--recompute-method": True,
    "--recompute-num-layers": True,
    "--use-distributed-optimizer": False,
}

_OPTIMIZER = {"adam": ["--optimizer", "adam"], "sgd": ["--optimizer", "sgd", "--sgd-momentum", "0"]}
_OPTIMIZER["momentum"] = ["--optimizer", "sgd", "--sgd-momentum", "0.9"]
_OPTIMIZER["adamw"] = ["--optimizer", "adam"]  # Megatron's adam decouples weight decay (AdamW)


def parse_arguments(text: str) -> list[tuple[str, str | None]]:
    """``megatron-args.txt`` back as ``(flag, value or None)`` pairs (``#`` lines are comments)."""
    out: list[tuple[str, str | None]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        flag, _, value = line.partition(" ")
        out.append((flag, value.strip() or None))
    return out


def _layer_counts(layers: int, stages: int) -> list[tuple[int, int, int]]:
    """Every ``(first, middle, last)`` layers per stage Megatron accepts for ``stages`` stages."""
    if stages == 1:
        return [(layers, 0, 0)]
    if stages == 2:
        return [(a, 0, layers - a) for a in range(1, layers)]
    out = []
    for a in range(1, layers):
        for b in range(1, layers - a):
            rest = layers - a - b
            if rest >= stages - 2 and rest % (stages - 2) == 0:
                out.append((a, rest // (stages - 2), b))
    return out


def _bounds(layout: TransformerLayers, stages: int, first: int, middle: int) -> tuple[int, ...]:
    per_stage = [first] + [middle] * (stages - 2) if stages > 1 else []
    bounds, layer = [0], 0
    for count in per_stage:
        layer += count
        bounds.append(layout.boundary(layer))
    return (*bounds, layout.blocks)


def _max_stages(profile: ModelProfile) -> int:
    return transformer_layers(profile, runtime="Megatron-LM").count


def _even(counts: tuple[int, int, int], stages: int) -> bool:
    """Whether ``(first, middle, last)`` is the plain even split (no uneven-stage flags needed)."""
    first, middle, last = counts
    return stages == 1 or (first == last and (stages == 2 or middle == first))


def _choose_cuts(profile: ModelProfile, stages: int, reference: tuple[int, ...]) -> Cuts:
    """The nearest cut Megatron can say (the even split on a tie, then the lighter first stage)."""
    layout = transformer_layers(profile, runtime="Megatron-LM")
    best = min(
        _layer_counts(layout.count, stages),
        key=lambda c: (cut_distance(_bounds(layout, stages, c[0], c[1]), reference), not _even(c, stages), c),
    )
    first, middle, last = best
    bounds = _bounds(layout, stages, first, middle)
    uneven = not _even(best, stages)
    settings = {"layers": layout.count, "first": first if uneven else None, "last": last if uneven else None}
    note = ""
    if bounds != reference:
        allowed = set(layout.starts[1:])
        inside = [b for b in reference[1:-1] if b not in allowed]
        why = f"block(s) {inside} fall inside a layer or beside the embedding/head; " if inside else ""
        shape = f"{first} layers first, " + (f"{middle} per middle stage, " if stages > 2 else "") + f"{last} last"
        note = f"{why}Megatron cuts whole layers, evenly but for the first and last stage: {shape}"
    return Cuts(bounds=bounds, settings=settings, note=note)


def _arguments(u: Uniform, plan: Plan, profile: ModelProfile) -> list[str]:
    config = profile.model.get("config", {}) if isinstance(profile.model, dict) else {}
    lines = ["# Written by hetplan export megatron: pretrain_gpt.py arguments, one per line"]
    lines.append(f"--num-layers {u.settings['layers']}")
    for flag, key in (("--hidden-size", "hidden"), ("--num-attention-heads", "heads"), ("--seq-length", "seq")):
        if key in config:
            lines.append(f"{flag} {config[key]}")
    if "seq" in config:
        lines.append(f"--max-position-embeddings {config['seq']}")
    if profile.model.get("family") == "gpt":
        lines.append("--untie-embeddings-and-output-weights")  # the zoo's GPT has its own LM head matrix
    lines += [f"--tensor-model-parallel-size {u.tensor_parallel}", f"--pipeline-model-parallel-size {u.stages}"]
    if u.settings["first"] is not None:
        lines.append(f"--decoder-first-pipeline-num-layers {u.settings['first']}")
        if u.stages > 2:  # with two stages the last takes the rest (and Megatron has no middle to split)
            lines.append(f"--decoder-last-pipeline-num-layers {u.settings['last']}")
    lines += [f"--micro-batch-size {u.micro_batch}", f"--global-batch-size {u.global_batch}"]
    dtype = plan.dtype or profile.dtype
    if dtype in ("fp16", "bf16"):
        lines.append(f"--{dtype}")
    optimizer = _OPTIMIZER[u.optimizer]
    lines += [f"{optimizer[i]} {optimizer[i + 1]}" for i in range(0, len(optimizer), 2)]
    lines.append(f"--lr {DEFAULT_LR[u.optimizer]}")
    if u.recompute == "full":  # every layer's input kept, the layer run again in backward
        lines += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    elif u.recompute == "selective":
        lines.append("--recompute-granularity selective")
    if u.zero:
        lines.append("--use-distributed-optimizer")  # optimizer state sharded over data parallel ranks
    return lines


def _render(u: Uniform, plan: Plan, profile: ModelProfile, cluster: Cluster) -> dict[str, str]:
    script = "pretrain_bert.py" if profile.model.get("family") == "bert" else "pretrain_gpt.py"
    command = f'"${{MEGATRON:-.}}/{script}" $(grep -v "^#" megatron-args.txt)'
    header = (
        f"# Written by hetplan export megatron: rank r runs pipeline stage r // {u.replicas * u.tensor_parallel}\n"
        "# (Megatron's default order tp-cp-ep-dp-pp); ranks are numbered node by node, in this file's order.\n"
        "# Add your data and tokenizer arguments to megatron-args.txt; MEGATRON is the Megatron-LM checkout.\n"
    )
    text = "\n".join(_arguments(u, plan, profile)) + "\n"
    problems = [
        f"{flag}: not a documented argument, or {'missing' if ARGUMENTS.get(flag) else 'an unexpected'} value"
        for flag, value in parse_arguments(text)
        if ARGUMENTS.get(flag) is not (value is not None)
    ]
    check_documented(problems, runtime="megatron", file="megatron-args.txt")
    return {
        "megatron-args.txt": text,
        "launch.sh": torchrun_script(u, command, header=header),
    }


def _notes(plan: Plan, profile: ModelProfile) -> list[str]:
    notes = []
    if (plan.dtype or profile.dtype) == "tf32":
        notes.append("dtype tf32: written as fp32 (no --fp16/--bf16); Megatron's TF32 use follows PyTorch's settings")
    return notes


RUNTIME = Runtime(
    name="megatron",
    title="Megatron-LM",
    doc="megatron/training/arguments.py of https://github.com/NVIDIA/Megatron-LM",
    schedules=("1f1b",),
    optimizers=("adam", "adamw", "sgd", "momentum"),
    max_stages=_max_stages,
    choose_cuts=_choose_cuts,
    render=_render,
    notes=_notes,
    tensor_parallel=True,
)

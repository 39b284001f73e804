"""Megatron-LM: the ``pretrain_gpt.py`` command-line arguments and one torchrun script a node.

    files = RUNTIME.render(uniform, plan, profile, cluster)   # {"megatron-args.txt": ..., "node-n0.sh": ...}

Megatron-LM pipelines transformer layers, the embedding (``E``) with the first stage and the output
layer and loss (``L``) with the last. ``--pipeline-model-parallel-layout`` says any cut at whole
layers exactly: ``Et*12|t*12|t*4|t*4L`` is four stages of 12, 12, 4 and 4 layers, and a stage may
hold the embedding or the output alone (``E|t*24|L``). A cut between the attention and the MLP of
one layer cannot be said: the export takes the nearest cut at whole layers. The data-parallel size
is what is left (``world size / (tensor x pipeline)``), the micro-batch count
``global batch / (micro-batch x data-parallel)``. Its schedule is 1F1B (GPipe is not offered).

Kept: the tensor-parallel degree (one for the model), recomputation (``--recompute-granularity``),
ZeRO-1 (``--use-distributed-optimizer``), and the plan's optimizer with every setting explicit:
Megatron's defaults (weight decay 0.01, gradient clipping at norm 1.0) would otherwise turn the
plan's ``adam`` into clipped AdamW. Every flag written is checked against
:data:`hetplan.export.megatron_args.MEGATRON_ARGUMENTS` (Megatron's ``arguments.py`` at a named
commit). The scripts export ``CUDA_DEVICE_MAX_CONNECTIONS=1`` when TP > 1 (Megatron's
``validate_args`` asserts it: TP communication must be scheduled before the GEMM it overlaps) and
``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
"""

from __future__ import annotations

from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.emit.rank_config import DEFAULT_LR
from hetplan.export.keys import check_documented
from hetplan.export.launch import node_scripts
from hetplan.export.megatron_args import MEGATRON_ARGUMENTS
from hetplan.export.partition import TransformerLayers, nearest_cuts, transformer_layers
from hetplan.export.structure import Cuts, Runtime, Uniform

__all__ = ["RUNTIME", "layout_flag", "parse_arguments", "parse_layout"]

#: The optimizer flags of each hetplan optimizer, every setting explicit (hetplan's ``adamw``
#: decays weights by 0.01, as its own runtime; nothing clips). Megatron's ``adam`` is AdamW
#: (decoupled weight decay), so ``adam`` is ``--weight-decay 0``.
_ADAM = [("--adam-beta1", "0.9"), ("--adam-beta2", "0.999"), ("--adam-eps", "1e-08")]
_OPTIMIZER: dict[str, list[tuple[str, str]]] = {
    "adam": [("--optimizer", "adam"), *_ADAM, ("--weight-decay", "0.0")],
    "adamw": [("--optimizer", "adam"), *_ADAM, ("--weight-decay", "0.01")],
    "sgd": [("--optimizer", "sgd"), ("--sgd-momentum", "0.0"), ("--weight-decay", "0.0")],
    "momentum": [("--optimizer", "sgd"), ("--sgd-momentum", "0.9"), ("--weight-decay", "0.0")],
}


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


def _candidates(layout: TransformerLayers) -> list[int]:
    """Block boundaries a layout can cut at: every layer start after block 0 and the end of the last
    layer (before the output), each a whole-layer boundary."""
    return sorted({b for b in layout.starts if b > 0} | ({layout.end} if layout.end < layout.blocks else set()))


def _max_stages(profile: ModelProfile) -> int:
    return len(_candidates(transformer_layers(profile, runtime="Megatron-LM"))) + 1


def layout_flag(layout: TransformerLayers, bounds: tuple[int, ...]) -> str:
    """``--pipeline-model-parallel-layout`` of a cut: ``E`` first, ``L`` last, ``t*k`` layers per stage."""
    stages = []
    for k in range(len(bounds) - 1):
        count = sum(1 for b in layout.starts if bounds[k] <= b < bounds[k + 1])
        text = ("E" if k == 0 else "") + ("t" if count == 1 else f"t*{count}" if count else "")
        stages.append(text + ("L" if k == len(bounds) - 2 else ""))
    return "|".join(stages)


def parse_layout(text: str) -> list[tuple[bool, int, bool]]:
    """A layout flag back as ``(embedding, layers, loss)`` per stage (the forms :func:`layout_flag` writes)."""
    out = []
    for stage in text.split("|"):
        embedding, loss = stage.startswith("E"), stage.endswith("L")
        body = stage[int(embedding) : len(stage) - int(loss)]
        layers = 0 if not body else 1 if body == "t" else int(body.removeprefix("t*"))
        out.append((embedding, layers, loss))
    return out


def _choose_cuts(profile: ModelProfile, stages: int, reference: tuple[int, ...]) -> Cuts:
    """The nearest cut at whole layers (any stage sizes, through the layout flag)."""
    layout = transformer_layers(profile, runtime="Megatron-LM")
    bounds = tuple(nearest_cuts(reference, _candidates(layout), 0, layout.blocks))
    flag = layout_flag(layout, bounds)
    note = ""
    if bounds != reference:
        inside = [b for b in reference[1:-1] if b not in _candidates(layout)]
        why = f"block(s) {inside} fall inside a layer; " if inside else ""
        note = f"{why}Megatron cuts whole layers: --pipeline-model-parallel-layout {flag}"
    return Cuts(bounds=bounds, settings={"layers": layout.count, "layout": flag}, note=note)


def _arguments(u: Uniform, plan: Plan, profile: ModelProfile) -> list[tuple[str, str | None]]:
    config = profile.model.get("config", {}) if isinstance(profile.model, dict) else {}
    out: list[tuple[str, str | None]] = [("--num-layers", str(u.settings["layers"]))]
    for flag, key in (("--hidden-size", "hidden"), ("--num-attention-heads", "heads"), ("--seq-length", "seq")):
        if key in config:
            out.append((flag, str(config[key])))
    if "seq" in config:
        out.append(("--max-position-embeddings", str(config["seq"])))
    if profile.model.get("family") == "gpt" and config.get("head", "untied") != "tied":
        # the zoo's GPT has its own LM head matrix; with ``head: tied`` it is the token table, Megatron's default
        out.append(("--untie-embeddings-and-output-weights", None))
    out += [("--tensor-model-parallel-size", str(u.tensor_parallel)), ("--pipeline-model-parallel-size", str(u.stages))]
    if u.stages > 1:
        out.append(("--pipeline-model-parallel-layout", u.settings["layout"]))
    out += [("--micro-batch-size", str(u.micro_batch)), ("--global-batch-size", str(u.global_batch))]
    dtype = plan.dtype or profile.dtype
    if dtype in ("fp16", "bf16"):
        out.append((f"--{dtype}", None))
    out += _OPTIMIZER[u.optimizer]
    out += [("--clip-grad", "0.0"), ("--lr", str(DEFAULT_LR[u.optimizer]))]
    if u.recompute == "full":  # every layer's input kept, the layer run again in backward
        out += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"), ("--recompute-num-layers", "1")]
    elif u.recompute == "selective":
        out.append(("--recompute-granularity", "selective"))
    if u.zero:
        out.append(("--use-distributed-optimizer", None))  # optimizer state sharded over data parallel ranks
    return out


def _problems(pairs: list[tuple[str, str | None]]) -> list[str]:
    """Flags Megatron's parser would refuse: unknown, a value where none is taken or none where one is,
    a value its type cannot convert or outside its choices."""
    problems = []
    for flag, value in pairs:
        arg = MEGATRON_ARGUMENTS.get(flag)
        if arg is None:
            problems.append(f"{flag}: not an argument of Megatron-LM's arguments.py")
        elif (arg.type is None) != (value is None):
            problems.append(f"{flag}: {'takes no value' if arg.type is None else 'takes a value'}")
        elif arg.type is not None and value is not None:
            try:
                arg.type(value)
            except ValueError:
                problems.append(f"{flag}: {value!r} is not {arg.type.__name__}")
            if arg.choices and value not in arg.choices:
                problems.append(f"{flag}: {value!r} is not one of {arg.choices}")
    return problems


def _render(u: Uniform, plan: Plan, profile: ModelProfile, cluster: Cluster) -> dict[str, str]:
    script = "pretrain_bert.py" if profile.model.get("family") == "bert" else "pretrain_gpt.py"
    command = f'"${{MEGATRON:-.}}/{script}" $(grep -v "^#" megatron-args.txt)'
    header = (
        f"# Written by hetplan export megatron: rank r runs pipeline stage r // {u.replicas * u.tensor_parallel}\n"
        "# (Megatron's default order tp-cp-ep-dp-pp); ranks are numbered node by node, in node-rank order.\n"
        "# Add your data and tokenizer arguments to megatron-args.txt; MEGATRON is the Megatron-LM checkout.\n"
        "# Run every node's script at the same time.\n"
    )
    pairs = _arguments(u, plan, profile)
    check_documented(_problems(pairs), runtime="megatron", file="megatron-args.txt")
    lines = ["# Written by hetplan export megatron: pretrain_gpt.py arguments, one per line"]
    lines += [flag if value is None else f"{flag} {value}" for flag, value in pairs]
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if u.tensor_parallel > 1 else {}
    return {"megatron-args.txt": "\n".join(lines) + "\n", **node_scripts(u, command, header=header, env=env)}


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
    recompute=("none", "selective", "full"),
    zero=True,
)

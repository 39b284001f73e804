"""Import a PipeDream profiler ``graph.txt`` (msr-fiddle/pipedream) as a hetplan ModelProfile.

    from hetplan.profile.importers import import_pipedream
    profile = import_pipedream("vgg16.graph.txt")                  # batch inferred: 128
    profile = import_pipedream("gnmt.graph.txt", batch_size=64)    # GNMT: no image input to infer from
    profile.save("vgg16.profile.yaml")

Every graph node becomes one block, in a deterministic topological order (see ``_dag``). Times are
the file's milliseconds for the whole profiled batch, stored as seconds at micro-batch = that batch.
``parameter_size`` is bytes of fp32 weights (Conv2d(128, 256, 3x3) has 295,168 parameters and the
file says 1,180,672 = 4 x 295,168); ``activation_size`` is bytes of a node's output for the whole
batch (a list ``[a; b; c]`` for a tuple output counts as its sum). docs/importers.md has the details.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.errors import HetplanError
from hetplan.profile.importers._common import catalog_name, read_text, require_positive_int
from hetplan.profile.importers._dag import cut_bytes, topological_order

__all__ = ["import_pipedream"]

FP32_BYTES = 4
_NODE_RE = re.compile(r"^node(\d+) -- (.*) -- (forward_compute_time=.*)$")
_EDGE_RE = re.compile(r"^\s+node(\d+) -- node(\d+)\s*$")
_METRICS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_CONV_RE = re.compile(
    r"^Conv2d\((\d+), (\d+), kernel_size=\((\d+), (\d+)\), stride=\((\d+), (\d+)\)(?:, padding=\((\d+), (\d+)\))?"
)
#: Square RGB crops an image profile may have been taken at (ImageNet 224, Inception 299, NASNet 331,
#: CIFAR 32); the first convolution's output size must agree, so a wrong guess cannot pass.
_IMAGE_SIDES = (224, 299, 331, 32)


@dataclass(frozen=True)
class _Node:
    id: int
    desc: str
    fwd_ms: float
    bwd_ms: float
    activation: float  # bytes, whole profiled batch
    param_bytes: float
    line: int

    @property
    def op(self) -> str:
        """The operator's name from the description: ``Conv2d``, ``ReLU``, ``Input``, ``__getitem__``."""
        match = re.match(r"[A-Za-z_][A-Za-z0-9_.]*", self.desc.strip())
        op = match.group(0) if match else "block"
        return "Input" if re.fullmatch(r"Input\d*", op) else op


def _number(text: str, *, file: str, line: int, key: str) -> float:
    """A metric value: a float, or ``[a; b; c]`` (a tuple output), summed."""
    text = text.strip()
    parts = text[1:-1].split(";") if text.startswith("[") and text.endswith("]") else [text]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise HetplanError(f"{key}={text!r} is not a number", file=file, field=f"line {line}") from None
    if not all(0 <= v < math.inf for v in values):  # also refuses NaN
        raise HetplanError(f"{key}={text!r} must be a finite non-negative number", file=file, field=f"line {line}")
    return sum(values)


def _parse_node(match: re.Match[str], *, file: str, line: int) -> _Node:
    metrics: dict[str, float] = {}
    for item in match.group(3).split(", "):
        key, sep, value = item.partition("=")
        if not sep:
            raise HetplanError(f"expected key=value, got {item!r}", file=file, field=f"line {line}")
        metrics[key.strip()] = _number(value, file=file, line=line, key=key.strip())
    missing = [k for k in _METRICS if k not in metrics]
    if missing:
        raise HetplanError(f"node line lacks {', '.join(missing)}", file=file, field=f"line {line}")
    return _Node(
        id=int(match.group(1)),
        desc=match.group(2),
        fwd_ms=metrics["forward_compute_time"],
        bwd_ms=metrics["backward_compute_time"],
        activation=metrics["activation_size"],
        param_bytes=metrics["parameter_size"],
        line=line,
    )


def _parse(text: str, *, file: str) -> tuple[dict[int, _Node], list[tuple[int, int]]]:
    """Node lines and edge lines, checked: duplicate nodes, unknown edge ends, malformed lines."""
    nodes: dict[int, _Node] = {}
    edges: list[tuple[int, int, int]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if node_match := _NODE_RE.match(raw.rstrip()):
            node = _parse_node(node_match, file=file, line=number)
            if node.id in nodes:
                raise HetplanError(
                    f"node{node.id} is defined twice (first on line {nodes[node.id].line})",
                    file=file,
                    field=f"line {number}",
                )
            nodes[node.id] = node
        elif edge_match := _EDGE_RE.match(raw):
            edges.append((int(edge_match.group(1)), int(edge_match.group(2)), number))
        else:
            raise HetplanError(
                "expected a node line 'nodeN -- Description -- forward_compute_time=MS, backward_compute_time=MS, "
                f"activation_size=BYTES, parameter_size=BYTES' or an indented edge 'nodeA -- nodeB', got {raw[:60]!r}",
                file=file,
                field=f"line {number}",
            )
    if not nodes:
        raise HetplanError("empty graph: no node lines", file=file)
    for u, v, number in edges:
        for end in (u, v):
            if end not in nodes:
                raise HetplanError(
                    f"edge names node{end}, which no node line defines", file=file, field=f"line {number}"
                )
    return nodes, [(u, v) for u, v, _ in edges]


def _conv_output_per_sample(desc: str, side: int) -> float | None:
    """Bytes of one sample's fp32 output of an RGB ``Conv2d`` fed a ``side`` x ``side`` image."""
    match = _CONV_RE.match(desc.strip())
    if match is None or int(match.group(1)) != 3:
        return None
    out_ch, kh, kw, sh, sw = (int(match.group(i)) for i in range(2, 7))
    ph, pw = (int(match.group(i) or 0) for i in (7, 8))
    height = (side + 2 * ph - kh) // sh + 1
    width = (side + 2 * pw - kw) // sw + 1
    return float(out_ch * height * width * FP32_BYTES) if height > 0 and width > 0 else None


def _infer_batch_size(nodes: dict[int, _Node], edges: list[tuple[int, int]]) -> tuple[int | None, str]:
    """The batch an image profile was taken at, and how it was found (None and why not, otherwise).

    The single ``Input`` node holds B x 3 x S x S fp32 values; B is accepted only when the first
    convolution fed by it has an output of exactly B x C_out x H' x W' fp32 values for that S.
    """
    inputs = [n for n in nodes.values() if n.op == "Input"]
    if len(inputs) != 1 or inputs[0].activation <= 0:
        return None, "no single Input node with an activation size to read the batch from"
    source = inputs[0]
    convs = [nodes[v] for u, v in edges if u == source.id and nodes[v].op == "Conv2d"]
    for side in _IMAGE_SIDES:
        per_sample_input = 3 * side * side * FP32_BYTES
        batch = source.activation / per_sample_input
        if batch < 1 or batch != int(batch):
            continue
        for conv in convs:
            per_sample_out = _conv_output_per_sample(conv.desc, side)
            if per_sample_out is not None and conv.activation == per_sample_out * batch:
                return int(batch), (
                    f"node{source.id} (Input) = {int(batch)} x 3x{side}x{side} fp32, confirmed by node{conv.id}'s "
                    f"Conv2d output = {int(batch)} x {int(per_sample_out)} bytes"
                )
    return None, "the Input node's size matches no RGB image batch confirmed by its first Conv2d"


def _model_name(path: Path) -> str:
    """``vgg16.graph.txt`` -> vgg16; PipeDream's own layout ``profiles/vgg16/graph.txt`` -> vgg16."""
    name = path.name.removesuffix(".txt").removesuffix(".graph")
    if name == "graph" and path.parent.name:
        return path.parent.name
    return name


def _resolve_batch(
    nodes: dict[int, _Node], edges: list[tuple[int, int]], batch_size: int | None, file: str
) -> tuple[int, dict]:
    inferred, how = _infer_batch_size(nodes, edges)
    if batch_size is not None:
        batch = require_positive_int(batch_size, name="batch_size", file=file)
        return batch, {"batch_from": "batch_size argument", "inferred_batch": inferred, "inference": how}
    if inferred is None:
        raise HetplanError(
            f"cannot infer the batch size this profile was measured at ({how}); pass batch_size=N (--batch-size N) "
            "(PipeDream's translation profiler README runs GNMT with --batch-size 64)",
            file=file,
            field="batch_size",
        )
    return inferred, {"batch_from": "inferred", "inference": how}


def import_pipedream(
    path: str | Path,
    *,
    device_type: str = "V100-16GB",
    batch_size: int | None = None,
    drop_input_time: bool = False,
) -> ModelProfile:
    """Read a PipeDream ``graph.txt``; one block per node, times on ``device_type`` at the profiled batch.

    ``drop_input_time=True`` zeroes the times of ``Input`` source nodes, as PipeDream's own optimizer
    does (they hold data loading, not GPU work); the default keeps the file's numbers unchanged.
    """
    path = Path(path)
    file = str(path)
    device = catalog_name(device_type, file=file, field="device_type")
    nodes, edges = _parse(read_text(path, what="a PipeDream graph.txt"), file=file)
    batch, batch_note = _resolve_batch(nodes, edges, batch_size, file)
    order = topological_order(nodes, edges, file=file)
    cuts = cut_bytes(order, {(u, v): nodes[u].activation for u, v in set(edges)})
    has_pred = {v for _, v in edges}
    dropped: dict[str, list[float]] = {}
    blocks: list[Block] = []
    for i, node_id in enumerate(order):
        node = nodes[node_id]
        fwd_ms, bwd_ms = node.fwd_ms, node.bwd_ms
        if drop_input_time and node.op == "Input" and node_id not in has_pred:
            dropped[f"node{node_id}"] = [fwd_ms, bwd_ms]
            fwd_ms = bwd_ms = 0.0
        blocks.append(
            Block(
                name=f"node{node_id}",
                kind=node.op,
                params=round(node.param_bytes / FP32_BYTES),
                param_bytes=node.param_bytes,
                activation_bytes=node.activation / batch,
                output_bytes=cuts[i] / batch,
                flops_fwd=0.0,
                times={device: {batch: Timing(fwd=fwd_ms / 1000.0, bwd=bwd_ms / 1000.0, source="imported")}},
            )
        )
    input_bytes = sum(n.activation for n in nodes.values() if n.op == "Input" and n.id not in has_pred) / batch
    source = {
        "importer": "pipedream",
        "file": path.name,
        "profiled_batch": batch,
        **batch_note,
        "device_type": device,
        "units": "times: ms per profiled batch -> s; activation_size: bytes per batch -> per sample; "
        "parameter_size: bytes (fp32)",
        "nodes": len(nodes),
        "edges": len(set(edges)),
    }
    if dropped:
        source["dropped_input_time_ms"] = dropped
    return ModelProfile(
        model={"name": _model_name(path), "config": {}},
        dtype="fp32",
        blocks=blocks,
        input_bytes=input_bytes,
        source=source,
    )

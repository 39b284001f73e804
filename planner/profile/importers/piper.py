"""Import a Piper input JSON (msr-fiddle/piper, NeurIPS 2021) as a hetplan ModelProfile.

    from hetplan.profile.importers import import_piper
    profile = import_piper("piper/bert32a100.json")                         # A100-80GB, vanilla
    profile = import_piper("bert32a100.json", variant="activation recomp", samples_per_unit=8)

Per node, the tensor-parallel-degree-1 entry (``TMPCs["1"]``) of the chosen variant is read:
``timePerSample`` (forward + backward seconds of one Piper "sample", which Piper's code calls a
micro-batch), split 1:2 into forward and backward; ``parameterSize`` (bytes, fp32);
``memoryUsageA`` (activation bytes stashed per in-flight micro-batch; Piper's memory model is
``A * y + B``). Edge ``communicationCost`` is bytes per Piper sample. One Piper sample is one hetplan
sample unless ``samples_per_unit`` says how many real samples it holds. See docs/importers.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from hetplan.contracts.model_profile import Block, ModelProfile, Timing
from hetplan.errors import HetplanError
from hetplan.profile.importers._common import catalog_name, read_json, require_positive_int
from hetplan.profile.importers._dag import cut_bytes, topological_order

__all__ = ["FORWARD_SHARE", "import_piper"]

FP32_BYTES = 4
#: Piper gives forward + backward together; backward is taken to cost twice the forward (1:2).
FORWARD_SHARE = 1.0 / 3.0
_TMPC_FIELDS = ("timePerSample", "parameterSize", "memoryUsageA", "memoryUsageB")


def _number(value: Any, *, file: str, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        raise HetplanError(f"expected a finite non-negative number, got {value!r}", file=file, field=field)
    return float(value)


def _integer(value: Any, *, file: str, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HetplanError(f"expected an integer id, got {value!r}", file=file, field=field)
    return value


def _variant(node: dict[str, Any], variant: str, *, file: str, where: str) -> dict[str, float]:
    """The chosen variant of the node's tensor-parallel-degree-1 entries, its numbers checked."""
    tmpcs = node.get("TMPCs")
    if not isinstance(tmpcs, dict) or not isinstance(tmpcs.get("1"), list) or not tmpcs["1"]:
        raise HetplanError(
            'expected TMPCs["1"]: a list of variants without tensor parallelism', file=file, field=f"{where}.TMPCs"
        )
    entries = tmpcs["1"]
    ids = [e.get("id") for e in entries if isinstance(e, dict)]
    matches = [e for e in entries if isinstance(e, dict) and e.get("id") == variant]
    if not matches:
        raise HetplanError(
            f"no variant {variant!r}; this node has: {', '.join(map(str, ids))}", file=file, field=f"{where}.TMPCs.1"
        )
    entry = matches[0]
    out: dict[str, float] = {}
    for key in _TMPC_FIELDS:
        if key not in entry:
            raise HetplanError(f"missing {key}", file=file, field=f"{where}.TMPCs.1[{variant}]")
        out[key] = _number(entry[key], file=file, field=f"{where}.TMPCs.1[{variant}].{key}")
    return out


def _parse_nodes(data: dict[str, Any], variant: str, file: str) -> tuple[dict[int, dict[str, float]], dict[int, str]]:
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise HetplanError("expected a list of nodes", file=file, field="nodes")
    if not nodes:
        raise HetplanError("empty graph: no nodes", file=file, field="nodes")
    costs: dict[int, dict[str, float]] = {}
    names: dict[int, str] = {}
    for i, node in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(node, dict):
            raise HetplanError("expected an object with id and TMPCs", file=file, field=where)
        node_id = _integer(node.get("id"), file=file, field=f"{where}.id")
        if node_id in costs:
            raise HetplanError(f"duplicate node id {node_id}", file=file, field=f"{where}.id")
        costs[node_id] = _variant(node, variant, file=file, where=where)
        name = node.get("name")
        names[node_id] = name if isinstance(name, str) and name else "block"
    return costs, names


def _parse_edges(data: dict[str, Any], nodes: dict[int, Any], file: str) -> dict[tuple[int, int], float]:
    edges = data.get("edges", [])
    if not isinstance(edges, list):
        raise HetplanError("expected a list of edges", file=file, field="edges")
    out: dict[tuple[int, int], float] = {}
    for i, edge in enumerate(edges):
        where = f"edges[{i}]"
        if not isinstance(edge, dict):
            raise HetplanError("expected an object with sourceId, destId, communicationCost", file=file, field=where)
        u = _integer(edge.get("sourceId"), file=file, field=f"{where}.sourceId")
        v = _integer(edge.get("destId"), file=file, field=f"{where}.destId")
        for end, key in ((u, "sourceId"), (v, "destId")):
            if end not in nodes:
                raise HetplanError(f"node {end} is not in nodes", file=file, field=f"{where}.{key}")
        if (u, v) in out:
            raise HetplanError(f"duplicate edge {u} -> {v}", file=file, field=where)
        out[(u, v)] = _number(edge.get("communicationCost"), file=file, field=f"{where}.communicationCost")
    return out


def _variants_in(data: dict[str, Any]) -> list[str]:
    seen: list[str] = []
    for node in data.get("nodes", []):
        for entry in (node.get("TMPCs", {}) or {}).get("1", []) if isinstance(node, dict) else []:
            if isinstance(entry, dict) and entry.get("id") not in seen:
                seen.append(entry.get("id"))
    return seen


def import_piper(
    path: str | Path,
    *,
    device_type: str = "A100-80GB",
    variant: str = "vanilla",
    samples_per_unit: int = 1,
) -> ModelProfile:
    """Read a Piper JSON: one block per node, times on ``device_type`` at micro-batch 1."""
    path = Path(path)
    file = str(path)
    device = catalog_name(device_type, file=file, field="device_type")
    unit = require_positive_int(samples_per_unit, name="samples_per_unit", file=file)
    data = read_json(path, what="a Piper input JSON")
    if not isinstance(data, dict):
        raise HetplanError("expected a JSON object with nodes and edges", file=file)
    costs, names = _parse_nodes(data, variant, file)
    edges = _parse_edges(data, costs, file)
    order = topological_order(costs, edges, file=file)
    cuts = cut_bytes(order, edges)
    blocks: list[Block] = []
    for i, node_id in enumerate(order):
        c = costs[node_id]
        fwd = c["timePerSample"] * FORWARD_SHARE
        bwd = c["timePerSample"] - fwd
        blocks.append(
            Block(
                name=f"node{node_id}",
                kind=names[node_id],
                params=round(c["parameterSize"] / FP32_BYTES),
                param_bytes=c["parameterSize"],
                activation_bytes=c["memoryUsageA"] / unit,
                output_bytes=cuts[i] / unit,
                flops_fwd=0.0,
                times={device: {1: Timing(fwd=fwd / unit, bwd=bwd / unit, source="imported")}},
            )
        )
    source = {
        "importer": "piper",
        "file": path.name,
        "variant": variant,
        "variants": _variants_in(data),
        "tensor_parallel": 1,
        "device_type": device,
        "samples_per_unit": unit,
        "forward_share": "timePerSample split 1:2 into forward:backward",
        "memory_usage_b_total": sum(c["memoryUsageB"] for c in costs.values()),
    }
    for key in ("mbsInBatch", "bandwidth", "maxMemoryPerDevice", "maxDevices"):
        if key in data:
            source[key] = data[key]
    return ModelProfile(
        model={"name": path.name.removesuffix(".json"), "config": {}},
        dtype="fp32",
        blocks=blocks,
        source=source,
    )

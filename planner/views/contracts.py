"""Rich tables (for people) and plain dicts (for ``--json``) of each contract file.

kind, obj = load_any(path)
console.print(*renderables(kind, obj))
print(json.dumps(summary(kind, obj)))
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.table import Table
from rich.text import Text

from hetplan.contracts.catalog import DTYPES, Catalog
from hetplan.contracts.cluster import Cluster
from hetplan.contracts.model_profile import ModelProfile
from hetplan.contracts.plan import Plan
from hetplan.contracts.runlog import StepRecord
from hetplan.units import format_bandwidth, format_bytes, format_time

__all__ = ["renderables", "summary"]


def catalog_table(catalog: Catalog) -> Table:
    table = Table(title=f"Device catalog ({len(catalog)} types)", title_justify="left")
    table.add_column("type")
    table.add_column("memory", justify="right")
    table.add_column("mem BW", justify="right")
    for dtype in DTYPES:
        table.add_column(f"{dtype} TFLOP/s", justify="right")
    table.add_column("aliases")
    for d in catalog:
        peaks = [f"{d.peak[k] / 1e12:g}" if k in d.peak else "-" for k in DTYPES]
        table.add_row(
            d.label(), format_bytes(d.memory), format_bandwidth(d.memory_bandwidth), *peaks, ", ".join(d.aliases)
        )
    return table


def catalog_summary(catalog: Catalog) -> dict[str, Any]:
    return {
        "kind": "catalog",
        "devices": {
            d.name: {
                "memory_bytes": d.memory,
                "memory_bandwidth_Bps": d.memory_bandwidth,
                "peak_tflops": {k: v / 1e12 for k, v in d.peak.items()},
                "aliases": list(d.aliases),
            }
            for d in catalog
        },
    }


def cluster_table(cluster: Cluster) -> list[Any]:
    title = f"Cluster {cluster.name}: {len(cluster.devices)} devices on {len(cluster.nodes)} nodes"
    table = Table(title=title, title_justify="left", caption=cluster.description or None, caption_justify="left")
    table.add_column("node")
    table.add_column("devices")
    table.add_column("memory each", justify="right")
    table.add_column("link inside", justify="right")
    table.add_column("NIC", justify="right")
    for node in cluster.nodes:
        counts = Counter(d.type.label() for d in node.devices)
        memories = [format_bytes(m) for m in sorted({d.type.memory for d in node.devices})]
        table.add_row(
            node.name,
            ", ".join(f"{n} x {t}" for t, n in counts.items()),
            ", ".join(memories),
            f"{format_bandwidth(node.link.bandwidth)}, {format_time(node.link.latency)}",
            format_bandwidth(node.nic_bandwidth),
        )
    lines = [f"network: {format_bandwidth(cluster.network.bandwidth)}, {format_time(cluster.network.latency)}"]
    for g in cluster.groups:
        lines.append(f"group {g.name} ({', '.join(sorted(g.nodes))}): {format_bandwidth(g.link.bandwidth)}")
    for o in cluster.overrides:
        lines.append(f"between {' and '.join(sorted(o.nodes))}: {format_bandwidth(o.link.bandwidth)}")
    out: list[Any] = [table, Text("\n".join(lines))]
    if cluster.emulated:
        out.append(Text("device speeds are EMULATED (slowdown factors on this machine)", style="bold yellow"))
    return out


def cluster_summary(cluster: Cluster) -> dict[str, Any]:
    return {
        "kind": "cluster",
        "name": cluster.name,
        "devices": len(cluster.devices),
        "nodes": [
            {
                "name": n.name,
                "devices": [
                    {"address": d.address, "type": d.type.name, "emulated": d.type.emulated} for d in n.devices
                ],
                "link": {"bandwidth_Bps": n.link.bandwidth, "latency_s": n.link.latency},
            }
            for n in cluster.nodes
        ],
        "network": {"bandwidth_Bps": cluster.network.bandwidth, "latency_s": cluster.network.latency},
        "emulated": cluster.emulated,
    }


def profile_table(profile: ModelProfile) -> list[Any]:
    devices = profile.device_types()
    model = profile.model.get("family") or profile.model.get("factory") or profile.model.get("name")
    title = f"Model profile {model} ({profile.dtype}, {len(profile.blocks)} blocks)"
    table = Table(title=title, title_justify="left")
    for col in ("#", "block", "kind"):
        table.add_column(col)
    for col in ("params", "act/sample", "out/sample", "GFLOP fwd"):
        table.add_column(col, justify="right")
    for dev in devices:
        table.add_column(f"{dev} f+b @1", justify="right")
    for i, b in enumerate(profile.blocks):
        times = []
        for dev in devices:
            # micro-batch 1 through the profile's own interpolation: blocks may list different sizes
            key = min(b.times[dev])
            t = b.times[dev][key]
            times.append(format_time((t.fwd + t.bwd) / key))
        table.add_row(
            str(i),
            b.name,
            b.kind,
            f"{b.params:,}",
            format_bytes(b.activation_bytes),
            format_bytes(b.output_bytes),
            f"{b.flops_fwd / 1e9:.3g}",
            *times,
        )
    total_params = profile.total_params
    sources = sorted({t.source for b in profile.blocks for by in b.times.values() for t in by.values()})
    shared = "".join(
        f"; {entry.name} ({entry.params:,}) shared by blocks {', '.join(map(str, entry.blocks))}"
        for entry in profile.shared
    )
    note = Text(
        f"total parameters {total_params:,}{shared}; times are {', '.join(sources)}; devices: {', '.join(devices)}"
    )
    return [table, note]


def profile_summary(profile: ModelProfile) -> dict[str, Any]:
    return {
        "kind": "profile",
        "model": profile.model,
        "dtype": profile.dtype,
        "blocks": len(profile.blocks),
        "params": profile.total_params,
        "flops_fwd_per_sample": sum(b.flops_fwd for b in profile.blocks),
        "device_types": profile.device_types(),
    }


def plan_summary(plan: Plan) -> dict[str, Any]:
    return {"kind": "plan", **plan.to_dict()}


def runlog_table(records: list[StepRecord]) -> list[Any]:
    table = Table(
        title=f"Run log: {len({r.step for r in records})} steps, {len({r.rank for r in records})} ranks",
        title_justify="left",
    )
    for col in ("rank", "pipeline", "stage", "device", "mean iter", "compute", "wait", "comm", "peak mem"):
        table.add_column(col)
    for rank in sorted({r.rank for r in records}):
        rs = [r for r in records if r.rank == rank]
        n = len(rs)
        table.add_row(
            str(rank),
            str(rs[0].pipeline),
            str(rs[0].stage),
            rs[0].device,
            format_time(sum(r.iteration_s for r in rs) / n),
            format_time(sum(r.compute_s for r in rs) / n),
            format_time(sum(r.wait_s for r in rs) / n),
            format_time(sum(r.comm_s for r in rs) / n),
            _peak(rs),
        )
    return [table]


def _peak(records: list[StepRecord]) -> str:
    measured = [r.peak_memory_bytes for r in records if r.peak_memory_bytes is not None]
    return format_bytes(max(measured)) if measured else "-"


def runlog_summary(records: list[StepRecord]) -> dict[str, Any]:
    losses = [r.loss for r in records if r.loss is not None]
    return {
        "kind": "runlog",
        "records": len(records),
        "steps": len({r.step for r in records}),
        "ranks": len({r.rank for r in records}),
        "last_loss": losses[-1] if losses else None,
    }


def measurements_table(m: Any) -> Table:
    table = Table(title=f"Measured runs ({len(m.runs)})", title_justify="left")
    for col in ("run", "plan", "iteration", "run log", "peak memory given for"):
        table.add_column(col)
    for r in m.runs:
        table.add_row(
            r.name,
            str(r.plan),
            format_time(r.iteration_s) if r.iteration_s is not None else "from the run log",
            str(r.run_log) if r.run_log else "-",
            ", ".join(sorted(r.peak_memory)) or "-",
        )
    return table


def measurements_summary(m: Any) -> dict[str, Any]:
    return {
        "kind": "measurements",
        "runs": [
            {
                "name": r.name,
                "plan": str(r.plan),
                "iteration_s": r.iteration_s,
                "run_log": str(r.run_log) if r.run_log else None,
                "peak_memory_bytes": dict(sorted(r.peak_memory.items())),
            }
            for r in m.runs
        ],
    }


def pool_table(pool: Any) -> Table:
    """The nodes a pool offers: devices per node, how many, the price per node-hour."""
    table = Table(title=f"Pool ({pool.file})", title_justify="left")
    for col in ("node", "devices per node", "available", "$/h per node"):
        table.add_column(col)
    for p in pool.nodes:
        kinds: dict[str, int] = {}
        for d in p.node.devices:
            kinds[d.type.name] = kinds.get(d.type.name, 0) + 1
        price = "-" if p.price_per_hour is None else f"${p.price_per_hour:g}"
        table.add_row(p.name, " + ".join(f"{n} x {t}" for t, n in kinds.items()), str(p.count), price)
    return table


def pool_summary(pool: Any) -> dict[str, Any]:
    return {
        "nodes": [
            {"name": p.name, "count": p.count, "devices": len(p.node.devices), "usd_per_hour": p.price_per_hour}
            for p in pool.nodes
        ]
    }


_TABLES = {
    "pool": pool_table,
    "catalog": catalog_table,
    "measurements": measurements_table,
    "cluster": cluster_table,
    "profile": profile_table,
    "runlog": runlog_table,
}
_SUMMARIES = {
    "pool": pool_summary,
    "catalog": catalog_summary,
    "measurements": measurements_summary,
    "cluster": cluster_summary,
    "profile": profile_summary,
    "plan": plan_summary,
    "runlog": runlog_summary,
}


def renderables(kind: str, obj: Any) -> list[Any]:
    """Rich objects that show ``obj`` (a loaded contract of ``kind``) to a person; a plan needs its
    cluster, so it is shown by :func:`hetplan.views.plan.plan_summary_renderables` instead."""
    out = _TABLES[kind](obj)
    return out if isinstance(out, list) else [out]


def summary(kind: str, obj: Any) -> dict[str, Any]:
    """A JSON-ready dict of ``obj`` for ``--json``."""
    return _SUMMARIES[kind](obj)

"""What a probe found, as a cluster entry, a JSON record and lines against the catalog (no torch).

    result.cluster_mapping()   # {"schema": "hetplan/cluster/v1", "nodes": [...], ...}: validates
    result.yaml_text()         # the same, with comments naming each GPU and every measured figure
    result.differences         # ["node0/0 H100-SXM: bf16 matmul 512.3 TFLOP/s, 36% below ...", ...]

A GPU whose name maps to a catalog type is written by that name: the planner keeps the catalog's
peaks and achieved fractions, and the comments and :attr:`ProbeResult.differences` say where this
GPU measured more than 20% away from them. A GPU the catalog lacks, and the CPU of a machine without
a GPU, become an inline ``spec:`` of *measured* rates with achieved fractions of 1 (the measured
figure is what a GEMM reaches). The intra-node link is the slowest GPU<->GPU copy measured; the
network between nodes is not measured (``--network``), and the comments say so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hetplan.contracts.catalog import Catalog, DeviceType
from hetplan.contracts.cluster import CLUSTER_SCHEMA, parse_cluster
from hetplan.contracts.yamlio import dump_yaml
from hetplan.errors import HetplanError
from hetplan.probe.seen import SeenDevice

__all__ = ["DIFFERENCE_THRESHOLD", "DeviceFigures", "ProbeResult"]

#: A measured figure more than this far from the catalog's expectation gets a line.
DIFFERENCE_THRESHOLD = 0.20
#: Achieved fractions assumed where a catalog type states none (hetplan.profile.efficiency's
#: generic figures are not imported here: a probe compares with the catalog entry only).
_NO_FRACTION = 1.0


@dataclass
class DeviceFigures:
    """What was measured on one device: matmul TFLOP/s per dtype, its memory copy bandwidth, and
    for a GPU pinned host<->device copies (bytes/s)."""

    matmul_tflops: dict[str, float] = field(default_factory=dict)
    memory_bandwidth: float = 0.0
    host_to_device: float = 0.0
    device_to_host: float = 0.0


@dataclass
class ProbeResult:
    """One node as probed. ``devices`` in PCI order; ``figures`` by device position; ``links``:
    ``"i->j"`` GPU<->GPU copy bytes/s (positions); ``link_latency`` seconds of a 4-byte copy."""

    node: str
    devices: list[SeenDevice]
    figures: list[DeviceFigures]
    catalog: Catalog
    links: dict[str, float] = field(default_factory=dict)
    link_latency: float = 0.0
    network: str = "100Gbps"
    network_latency: str = "10us"
    host: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ types
    def _type_name(self, position: int) -> str:
        device = self.devices[position]
        if device.type is not None:
            return device.type
        base = re.sub(r"[^A-Za-z0-9]+", "-", device.name.replace("NVIDIA", "")).strip("-") or "device"
        if device.kind == "cpu":
            base = "host-cpu"
        return base if base not in self.catalog else f"{base}-probed"

    def _catalog_type(self, position: int) -> DeviceType | None:
        name = self.devices[position].type
        return self.catalog.get(name) if name is not None else None

    def _measured_spec(self, position: int) -> dict[str, Any]:
        """An inline spec of what was measured: rates as 'peaks' the GEMM reaches entirely."""
        device, figures = self.devices[position], self.figures[position]
        rates = {dt: float(f"{v:.4g}") for dt, v in figures.matmul_tflops.items() if v > 0}
        if device.kind == "cpu":  # a CPU plan runs fp32; other dtypes stay in the comments
            rates = {"fp32": rates["fp32"]}
        memory_bw = max(figures.memory_bandwidth, 1e6)
        spec: dict[str, Any] = {
            "vendor": "generic" if device.kind == "cpu" else "probed",
            "backends": ["gloo"] if device.kind == "cpu" else ["nccl", "gloo"],
            "memory": f"{device.memory / 2**30:.2f}GiB",
            "memory_bandwidth": f"{memory_bw / 1e9:.2f}GB/s",
            "reserve": "0GiB" if device.kind == "cpu" else "1GiB",
            "fragmentation": 0.0 if device.kind == "cpu" else 0.05,
            "tflops": rates,
            "efficiency": {
                "gemm": dict.fromkeys(rates, 1.0),
                "attention": 0.5,
                "memory": 1.0,
                "launch": "5us",
                "sms": max(1, device.sms),
            },
        }
        return spec

    # ------------------------------------------------------------------ the entry
    def cluster_mapping(self) -> dict[str, Any]:
        """This node as a one-node hetplan/cluster/v1 mapping (devices grouped in PCI order)."""
        entries: list[dict[str, Any]] = []
        for position in range(len(self.devices)):
            name = self._type_name(position)
            if entries and entries[-1]["type"] == name:
                entries[-1]["count"] += 1
                continue
            entry: dict[str, Any] = {"type": name, "count": 1}
            if self.devices[position].type is None:
                entry["spec"] = self._measured_spec(position)
            entries.append(entry)
        node: dict[str, Any] = {"name": self.node, "devices": entries}
        if len(self.devices) > 1:
            bandwidth = min(self.links.values()) if self.links else 0.0
            if bandwidth <= 0:
                raise HetplanError("no GPU<->GPU copy was measured between the node's devices", field="links")
            node["link"] = {
                "bandwidth": f"{bandwidth / 1e9:.2f}GB/s",
                "latency": f"{max(self.link_latency, 1e-7) * 1e6:.1f}us",
            }
        what = (
            f"{len(self.devices)} GPU(s) in PCI order"
            if self.devices and self.devices[0].kind != "cpu"
            else "the CPU (no GPU seen)"
        )
        return {
            "schema": CLUSTER_SCHEMA,
            "name": self.node,
            "description": f"Probed by 'hetplan probe' on {self.host.get('hostname', self.node)}: "
            f"{what}; network not measured.",
            "nodes": [node],
            "network": {"bandwidth": self.network, "latency": self.network_latency},
        }

    def validate(self) -> None:
        """Check the entry with the cluster contract (a failure here is the probe's bug)."""
        parse_cluster(self.cluster_mapping(), file=f"<probe of {self.node}>", catalog=self.catalog)

    # ------------------------------------------------------------------ against the catalog
    def _expected(self, device_type: DeviceType, dtype: str) -> tuple[float, float, float]:
        """(expected TFLOP/s, peak TFLOP/s, achieved fraction) the catalog gives ``dtype``."""
        peak = device_type.peak_flops(dtype) / 1e12
        math = device_type.math_dtype(dtype)
        fraction = None
        if device_type.efficiency is not None:
            fraction = device_type.efficiency.gemm_fraction(math)
        fraction = fraction if fraction is not None else _NO_FRACTION
        return peak * fraction, peak, fraction

    def comparisons(self) -> list[dict[str, Any]]:
        """Every measured figure beside the catalog's expectation, for devices of a catalog type."""
        rows: list[dict[str, Any]] = []
        for position, device in enumerate(self.devices):
            reference = self._catalog_type(position)
            if reference is None and device.kind == "cpu" and "cpu" in self.catalog:
                reference = self.catalog.get("cpu")
            if reference is None:
                continue
            where = f"{self.node}/{position} {reference.name}"
            figures = self.figures[position]
            for dtype, measured in figures.matmul_tflops.items():
                try:
                    expected, peak, fraction = self._expected(reference, dtype)
                except HetplanError:
                    continue
                rows.append(
                    {"device": where, "what": f"{dtype} matmul", "measured": measured, "expected": expected,
                     "unit": "TFLOP/s", "basis": f"peak {peak:g} x achieved {fraction:g}"}
                )  # fmt: skip
            if figures.memory_bandwidth > 0:
                fraction = reference.efficiency.memory if reference.efficiency else _NO_FRACTION
                rows.append(
                    {"device": where, "what": "memory copy", "measured": figures.memory_bandwidth / 1e9,
                     "expected": reference.memory_bandwidth * fraction / 1e9, "unit": "GB/s",
                     "basis": f"bandwidth {reference.memory_bandwidth / 1e9:g} GB/s x achieved {fraction:g}"}
                )  # fmt: skip
            rows.append(
                {"device": where, "what": "memory", "measured": device.memory / 2**30,
                 "expected": reference.memory / 2**30, "unit": "GiB", "basis": "catalog capacity"}
            )  # fmt: skip
        for row in rows:
            row["difference"] = row["measured"] / row["expected"] - 1.0 if row["expected"] > 0 else 0.0
        return rows

    @property
    def differences(self) -> list[str]:
        """One line per measured figure more than :data:`DIFFERENCE_THRESHOLD` from the catalog."""
        lines = []
        for row in self.comparisons():
            if abs(row["difference"]) <= DIFFERENCE_THRESHOLD:
                continue
            side = "above" if row["difference"] > 0 else "below"
            lines.append(
                f"{row['device']}: {row['what']} {row['measured']:.4g} {row['unit']} is "
                f"{abs(row['difference']):.0%} {side} the catalog's {row['expected']:.4g} ({row['basis']})"
            )
        return lines

    # ------------------------------------------------------------------ files
    def to_dict(self) -> dict[str, Any]:
        """Everything measured, in base units and TFLOP/s, for a JSON record."""
        return {
            "node": self.node,
            "host": dict(self.host),
            "settings": dict(self.settings),
            "devices": [
                {
                    "position": i,
                    "torch_index": d.index,
                    "name": d.name,
                    "kind": d.kind,
                    "pci_bus_id": d.pci_bus_id,
                    "catalog_type": d.type,
                    "entry_type": self._type_name(i),
                    "memory_bytes": d.memory,
                    "matmul_tflops": dict(f.matmul_tflops),
                    "memory_bandwidth": f.memory_bandwidth,
                    "host_to_device": f.host_to_device,
                    "device_to_host": f.device_to_host,
                }
                for i, (d, f) in enumerate(zip(self.devices, self.figures, strict=True))
            ],
            "links": dict(self.links),
            "link_latency_s": self.link_latency,
            "comparisons": self.comparisons(),
            "differences": self.differences,
            "cluster": self.cluster_mapping(),
        }

    def _comment_lines(self) -> list[str]:
        lines = [
            "Written by 'hetplan probe' (measured, not copied from the catalog).",
            f"host: {self.host.get('hostname', '?')}, {self.host.get('cpu', '?')}, "
            f"torch {self.host.get('torch', '?')}, CUDA_DEVICE_ORDER={self.host.get('cuda_device_order', '?')}, "
            f"CUDA_VISIBLE_DEVICES={self.host.get('cuda_visible_devices') or '(unset)'}",
            f"settings: {', '.join(f'{k}={v}' for k, v in self.settings.items())}",
        ]
        for i, (d, f) in enumerate(zip(self.devices, self.figures, strict=True)):
            rates = ", ".join(f"{dt} {v:.4g}" for dt, v in f.matmul_tflops.items())
            lines.append(
                f"{self.node}/{i}: {d.name} (pci {d.pci_bus_id or '?'}, {d.memory / 2**30:.1f} GiB) -> "
                f"{self._type_name(i)}; matmul TFLOP/s: {rates}; memory copy {f.memory_bandwidth / 1e9:.1f} GB/s"
                + (
                    f"; host->device {f.host_to_device / 1e9:.1f} GB/s, device->host {f.device_to_host / 1e9:.1f} GB/s"
                    if d.kind != "cpu"
                    else ""
                )
            )
        for pair, bandwidth in self.links.items():
            lines.append(f"GPU {pair}: {bandwidth / 1e9:.1f} GB/s")
        differences = self.differences
        lines.append(
            "against the catalog (> 20% apart): " + ("none" if not differences else f"{len(differences)} figure(s)")
        )
        lines.extend(f"  {line}" for line in differences)
        lines.append(f"network: {self.network} at {self.network_latency} is NOT measured; set it to your fabric.")
        return lines

    def yaml_text(self) -> str:
        """The cluster entry with a comment header of every measured figure."""
        header = "".join(f"# {line}\n" for line in self._comment_lines())
        return header + dump_yaml(self.cluster_mapping())

    def summary(self) -> str:
        """One line: the node, its devices by entry type, and how many figures differ."""
        counts: dict[str, int] = {}
        for i in range(len(self.devices)):
            counts[self._type_name(i)] = counts.get(self._type_name(i), 0) + 1
        devices = ", ".join(f"{n} x {t}" for t, n in counts.items())
        n = len(self.differences)
        return f"node {self.node}: {devices}; {n} figure(s) more than 20% from the catalog"

    def write_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON (its folder is created)."""
        target = Path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise HetplanError(f"cannot write: {exc.strerror}", file=str(path)) from None
        return target

    def write(self, path: str | Path) -> Path:
        """Validate the entry, then write it (its folder is created)."""
        self.validate()
        target = Path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(self.yaml_text(), encoding="utf-8")
        except OSError as exc:
            raise HetplanError(f"cannot write: {exc.strerror}", file=str(path)) from None
        return target

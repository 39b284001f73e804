"""The GPUs people rent now (H100-PCIe, H200, A10G, L40S, B200, MI300X): present with dense
figures, the dtypes and backends each runs, and a row with a source in docs/catalog.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hetplan.contracts import load_catalog
from hetplan.contracts.catalog import BACKENDS, default_backends
from hetplan.contracts.catalog import load_catalog as load
from hetplan.contracts.cluster import parse_cluster
from hetplan.errors import HetplanError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "catalog.md"
GiB = 2.0**30

#: name -> (memory GiB, bandwidth GB/s, dense TFLOP/s per dtype): the datasheet figures, sparsity halved.
RENTED = {
    "H100-PCIe": (80, 2000, {"fp32": 51, "tf32": 378, "fp16": 756.5, "bf16": 756.5}),
    "H200": (141, 4800, {"fp32": 67, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5}),
    "A10G": (24, 600, {"fp32": 35, "tf32": 35, "fp16": 70, "bf16": 70}),
    "L40S": (48, 864, {"fp32": 91.6, "tf32": 183, "fp16": 362.05, "bf16": 362.05}),
    "B200": (180, 7700, {"fp32": 75, "tf32": 1100, "fp16": 2250, "bf16": 2250}),
    "MI300X": (192, 5300, {"fp32": 163.4, "fp16": 1307.4, "bf16": 1307.4}),
}


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.mark.parametrize("name", sorted(RENTED))
def test_rented_type_has_its_datasheet_figures(catalog, name: str) -> None:
    memory, bandwidth, tflops = RENTED[name]
    device = catalog.get(name)
    assert device.memory == memory * GiB
    assert device.memory_bandwidth == pytest.approx(bandwidth * 1e9)
    assert {k: v / 1e12 for k, v in device.peak.items()} == pytest.approx(tflops)
    assert device.efficiency is not None and device.efficiency.sms > 0
    assert set(device.backends) == {"nccl", "gloo"}


def test_dtypes_each_type_runs(catalog) -> None:
    # MI300X: no tf32 entry (PyTorch on ROCm runs float32 matmuls as fp32 by default): priced at fp32
    mi300x = catalog.get("MI300X")
    assert mi300x.supports("bf16") and mi300x.math_dtype("tf32") == "fp32"
    assert mi300x.peak_flops("tf32") == mi300x.peak_flops("fp32")
    # A10G runs GeForce-style half-rate FP32-accumulate tensor math: well under the A10's full rate
    a10g, a10 = catalog.get("A10G"), catalog.get("A10")
    assert a10g.peak_flops("bf16") == 2 * a10g.peak_flops("tf32") < 0.6 * a10.peak_flops("bf16")
    # L40S runs it at the full rate: more than twice an RTX 4090's FP32-accumulate figure
    assert catalog.get("L40S").peak_flops("fp16") > 2 * catalog.get("RTX-4090").peak_flops("fp16")
    # H200 is the H100 SXM's GPU with more, faster memory
    h100, h200 = catalog.get("H100-SXM"), catalog.get("H200")
    assert h200.peak == h100.peak and h200.memory > h100.memory and h200.memory_bandwidth > h100.memory_bandwidth
    assert catalog.get("B200").peak_flops("bf16") > 2 * h100.peak_flops("bf16") * 1.1


def test_backends_of_every_bundled_type(catalog) -> None:
    for device in catalog:
        assert device.backends and set(device.backends) <= set(BACKENDS), device.name
    assert catalog.get("cpu").backends == ("gloo",)
    assert default_backends("NVIDIA") == ("nccl", "gloo") and default_backends("generic") == ("gloo",)


@pytest.mark.parametrize(
    ("backends", "reason"),
    [("[nccl, mpi]", "unknown backend 'mpi'"), ("[gloo, gloo]", "each backend once"), ("nccl", "expected a list")],
)
def test_bad_backends_are_refused_with_a_place(tmp_path: Path, backends: str, reason: str) -> None:
    path = tmp_path / "devices.yaml"
    path.write_text(
        "schema: hetplan/devices/v1\ndevices:\n  X:\n"
        f"    memory: 8GiB\n    memory_bandwidth: 100GB/s\n    tflops: {{fp32: 10}}\n    backends: {backends}\n"
    )
    with pytest.raises(HetplanError, match=re.escape(reason)) as info:
        load(path)
    assert info.value.file == str(path) and info.value.field.startswith("devices.X.backends")


def test_inline_spec_states_or_inherits_backends(catalog) -> None:
    data = {
        "schema": "hetplan/cluster/v1",
        "name": "c",
        "nodes": [
            {"name": "a", "devices": [{"type": "gpu-x", "spec": {"vendor": "AMD", "memory": "8GiB",
             "memory_bandwidth": "100GB/s", "tflops": {"fp32": 10}}}]},
            {"name": "b", "devices": [{"type": "npu-y", "spec": {"memory": "8GiB", "memory_bandwidth": "100GB/s",
             "tflops": {"fp32": 10}, "backends": ["gloo"]}}]},
        ],
        "network": {"bandwidth": "10Gbps"},
    }  # fmt: skip
    cluster = parse_cluster(data, catalog=catalog)
    assert cluster.device_types["gpu-x"].backends == ("nccl", "gloo")
    assert cluster.device_types["npu-y"].backends == ("gloo",)


def test_docs_catalog_has_a_sourced_row_for_every_type(catalog) -> None:
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 9:
            rows[cells[0]] = cells
    for device in catalog:
        assert device.name in rows, f"docs/catalog.md has no row for {device.name}"
        assert rows[device.name][-1], f"{device.name}: no source in docs/catalog.md"
    text = DOCS.read_text(encoding="utf-8").split("### Dtypes and backends", 1)[1]
    stated = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4 and cells[0] in catalog:
            stated[cells[0]] = cells
    for name in [*RENTED, "cpu"]:
        device = catalog.get(name)
        dtypes = ["fp32", *(dt for dt in ("tf32", "fp16", "bf16") if dt in device.peak)]
        assert stated[name][1] == ", ".join(dtypes), name
        assert stated[name][2] == ", ".join(device.backends), name
